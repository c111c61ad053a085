"""Which seeded weight draw a fixture keeps: the first whose float32 reference has no near-ties (argmax at every prompt
position and greedy step, MoE expert choice, bfloat16 variants' expert choice), so that an implementation summing in
another order reproduces it; and the routing statistics meta.json records."""
import copy

from gemma4_fixture_run import greedy_manual, logits_of, routing

import torch


MAX_ATTEMPTS = 2000
MIN_ROUTER_LOGIT_GAP = 5e-3    # k-th vs (k+1)-th router logit, float32, prompt + greedy continuation
MIN_GREEDY_GAP = 1e-2          # top-2 logit gap at every greedy step, float32
MIN_PROMPT_GAP = 1e-3          # top-2 logit gap at every prompt position, float32


@torch.no_grad()
def screen(model, tokens):
    """Robustness of a float32 reference to float reordering (C++ sums in another order, ~1e-6 relative): no
    near-tie in the argmax at any prompt position or greedy step, and no near-tie in MoE expert selection.
    MoE models also need three bfloat16 variants (see bf16_routing_flips) to pick the same experts as float32 at
    every prompt position: else logits_bf16 carries routing flips that an independent bf16 implementation need
    not reproduce (one flip moves logits by several units)."""
    result = dict(ok=False, prompt_top2_gap=round(min(top2_gaps(logits_of(model, tokens))), 5))
    moe = any(n.endswith(".router") for n, _ in model.named_modules())
    if moe:   # cheapest rejections first
        result["bf16_expert_choice_differs"] = bf16_routing_flips(model, tokens)
        if any(result["bf16_expert_choice_differs"].values()):
            return result
    if result["prompt_top2_gap"] < MIN_PROMPT_GAP:
        return result
    cont, greedy_gaps = greedy_manual(model, tokens)
    result["greedy_top2_gap"] = round(min(greedy_gaps), 5)
    if moe:
        result["router_logit_gap"] = round(routing(model, torch.cat([tokens, cont]).long()[:-1])[0], 6)
    result["ok"] = result["greedy_top2_gap"] >= MIN_GREEDY_GAP and (
        not moe or result["router_logit_gap"] >= MIN_ROUTER_LOGIT_GAP)
    return result


BF16_VARIANTS = {   # (attention, experts) implementations; the reference is the first
    "eager/eager": ("eager", "eager"), "eager/grouped_mm": ("eager", "grouped_mm"), "sdpa/eager": ("sdpa", "eager")}


def bf16_routing_flips(model_f32, tokens):
    """Per bfloat16 variant: number of (layer, prompt position) whose top-k expert set differs from float32.
    The variants round differently (grouped_mm, transformers' default, sums the top-k expert outputs in float32
    and rounds once; eager rounds each expert output to bf16 and accumulates in bf16), standing in for an
    independent bf16 implementation."""
    _, chosen_f32 = routing(model_f32, tokens.long())
    bf, flips = bf16_copy(model_f32), {}
    for variant, (attn, experts) in BF16_VARIANTS.items():
        bf.set_attn_implementation(attn)
        bf.set_experts_implementation(experts)
        _, chosen = routing(bf, tokens.long())
        flips[variant] = sum(int((a != b).any(-1).sum()) for a, b in zip(chosen_f32, chosen))
    return flips


def bf16_copy(model):
    """What from_pretrained(dtype=bfloat16) builds: bf16 params and buffers, but float32 RoPE inv_freq."""
    bf = copy.deepcopy(model).to(torch.bfloat16)
    for n, b in model.named_buffers():
        if n.endswith("inv_freq"):
            bf.get_buffer(n).data = b.clone()
    return bf


def routing_stats(f32, bf, tokens, full_seq):
    """MoE only: the float32 selection margin, and where the bfloat16 model picks other experts than float32."""
    gap, chosen_f32 = routing(f32, full_seq[:-1])
    if gap is None:
        return None
    _, on_prompt_f32 = routing(f32, tokens.long())
    _, on_prompt_bf16 = routing(bf, tokens.long())
    differ = sum(int((a != b).any(-1).sum()) for a, b in zip(on_prompt_f32, on_prompt_bf16))
    return dict(min_router_logit_gap_f32_prompt_and_greedy=gap,
                bf16_vs_f32_expert_choice_differs_count=differ,
                bf16_variants_vs_f32_expert_choice_differs=bf16_routing_flips(f32, tokens),
                experts_f32_prompt=[c.tolist() for c in on_prompt_f32])


def top2_gaps(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()
