"""A fixture model in transformers: loaded as a user loads it, its logits, greedy continuations (generate() and a
plain argmax chain), MoE router decisions, and how far a 1-ulp change of single weights moves the logits."""
import json
from pathlib import Path

from gemma4_fixture_specs import ATTN, EXPERTS, GREEDY_TOKENS, PREFIX
from gemma4_fixture_weights import seed_for

import torch
import transformers
from safetensors import safe_open
from transformers import GenerationConfig


def load_model(path, dtype, attn=ATTN, experts=EXPERTS, **kwargs):
    # The class config.json names (Gemma4ForConditionalGeneration or Gemma4UnifiedForConditionalGeneration).
    model_class = getattr(transformers, json.loads((Path(path) / "config.json").read_text())["architectures"][0])
    model, info = model_class.from_pretrained(
        path, dtype=dtype, attn_implementation=attn, experts_implementation=experts, output_loading_info=True,
        **kwargs)
    problems = {k: sorted(v)[:5] for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"loading {path}: {problems}")
    # transformers bug (see check_transformers_load.py): expert dequantize returns the scale dtype (bf16), not the
    # requested dtype. bf16 -> float32 is exact.
    for n, p in model.named_parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model.eval()


@torch.no_grad()
def logits_of(model, tokens):
    return model(input_ids=tokens[None], use_cache=False).logits[0].float()


def greedy_config(spec):
    # No sampling, no stop token: the continuation is a pure argmax chain of exactly GREEDY_TOKENS tokens.
    return GenerationConfig(max_new_tokens=GREEDY_TOKENS, min_new_tokens=0, do_sample=False, eos_token_id=None,
                            pad_token_id=spec["gen"]["pad_token_id"], bos_token_id=spec["gen"]["bos_token_id"],
                            temperature=None, top_k=None, top_p=None)


@torch.no_grad()
def greedy(model, tokens, spec, use_cache):
    ids = tokens[None].long()
    # generate() fills unset fields from model.generation_config (generation_config.json: eos [1, 106, 50],
    # do_sample true): swap it for the greedy one so that nothing stops the chain early.
    saved, model.generation_config = model.generation_config, greedy_config(spec)
    try:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             generation_config=greedy_config(spec), use_cache=use_cache)
    finally:
        model.generation_config = saved
    new = out[0, tokens.numel():]
    assert new.numel() == GREEDY_TOKENS, f"generate stopped after {new.numel()} tokens"
    return new.to(torch.int32)


@torch.no_grad()
def greedy_manual(model, tokens):
    """Argmax chain recomputing the full sequence every step (no cache); also returns the top-2 gap per step."""
    seq, gaps = tokens.long().tolist(), []
    for _ in range(GREEDY_TOKENS):
        logits = logits_of(model, torch.tensor(seq))[-1]
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        seq.append(int(logits.argmax()))
    return torch.tensor(seq[tokens.numel():], dtype=torch.int32), gaps


@torch.no_grad()
def routing(model, ids):
    """Router decisions on ids (no cache): (min over layers/tokens of the k-th minus (k+1)-th router logit, i.e.
    how close top-k selection is to a flip; [per layer: sorted expert ids per token]). (None, None) without MoE."""
    gaps, chosen = [], []

    def hook(module, args, output):
        probs, _, index = output
        k = module.config.top_k_experts
        top = torch.topk(probs.double(), k + 1, dim=-1).values   # log p_i - log p_j = logit_i - logit_j
        gaps.append(float((top[:, k - 1].log() - top[:, k].log()).min()))
        chosen.append(torch.sort(index, dim=-1).values)

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith(".router")]
    if not handles:
        return None, None
    model(input_ids=ids[None], use_cache=False)
    for h in handles:
        h.remove()
    return min(gaps), chosen


def next_bf16_ulp(x):
    """x with its bf16 magnitude increased by one ulp (x is bf16-exact and non-zero)."""
    b = x.to(torch.bfloat16).view(torch.int16) + 1
    return b.view(torch.bfloat16).float()


@torch.no_grad()
def sensitivity(model, tokens, base, name, kinds):
    """Perturb single weights by one bf16 ulp, one at a time; the max |logit change| each causes."""
    gen = torch.Generator().manual_seed(seed_for(name, "probe"))
    params = dict(model.named_parameters())
    params.update({n: b for n, b in model.named_buffers() if n.endswith("layer_scalar")})
    names = sorted(params)
    # Probe every kind of tensor: one per tensor family (the suffix after the layer index), 2 elements each.
    families = {}
    for n in names:
        fam = n.split(".layers.")[-1].split(".", 1)[-1] if ".layers." in n else n
        families.setdefault(fam, []).append(n)
    probes, seen = [], set()
    prompt_rows = sorted(set(tokens.tolist()))
    for fam in sorted(families):
        for _ in range(2):
            pname = families[fam][int(torch.randint(len(families[fam]), (1,), generator=gen))]
            t = params[pname]
            flat = t.view(-1)
            for _ in range(100):
                if pname.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight")):
                    # a row the prompt looks up (other rows only reach the logits through the tied LM head)
                    row = prompt_rows[int(torch.randint(len(prompt_rows), (1,), generator=gen))]
                    idx = row * t.shape[1] + int(torch.randint(t.shape[1], (1,), generator=gen))
                else:
                    idx = int(torch.randint(flat.numel(), (1,), generator=gen))
                if flat[idx] != 0 and (pname, idx) not in seen:
                    break
            if (pname, idx) in seen:
                continue
            seen.add((pname, idx))
            old = flat[idx].clone()
            flat[idx] = next_bf16_ulp(old)
            delta = float((logits_of(model, tokens) - base).abs().max())
            flat[idx] = old
            probes.append(dict(tensor=pname.removeprefix(PREFIX), kind=kinds.get(pname, "?"), index=idx,
                               value=float(old), max_abs_dlogit=delta))
    assert torch.equal(logits_of(model, tokens), base)
    deltas = sorted(p["max_abs_dlogit"] for p in probes)
    worst = max(probes, key=lambda p: p["max_abs_dlogit"])
    return dict(probes=len(probes), max_abs_dlogit=deltas[-1], median_abs_dlogit=deltas[len(deltas) // 2],
                worst_tensor=worst["tensor"], per_probe=probes)


def load_safetensors_file(path):
    with safe_open(path, framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}
