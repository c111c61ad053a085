#!/usr/bin/env python3
"""make_assistant_fixtures.py: external reference fixtures for Gemma 4's assistant drafters, against which the
engine's drafter is checked for parity.

Builds tiny random Gemma4AssistantForCausalLM drafters with Hugging Face transformers (pinned 5.23.0, CPU) beside
the committed target fixtures of make_gemma4_fixtures.py, and writes tests/fixtures/<name>/:
  bf16/                  the drafter saved by transformers in bf16 (model.*, pre_projection, post_projection, and for
                         the ordered-embeddings head masked_embedding.centroids + token_ordering), config.json
                         Google-style (text_config with global_head_dim instead of 5.23's per_layer_config).
                         Attention/MLP linears, pre/post_projection and centroids sit on the QAT grid.
  w4a16/                 the same weights in compressed-tensors pack-quantized W4A16 form (packed by the package).
  reference.safetensors  tokens I32 [T] (the target fixture's prompt); chain_f32 F32 [T, 4, vocab] and chain_bf16
                         BF16 [T, 4, vocab]: row t = the drafter's 4 greedy drafts after position t, fed tokens[t+1]
                         (the last row: the target's argmax at T-1); chain_ids_f32 / chain_ids_bf16 I32 [T, 4];
                         bf16_cluster_tie I32 [T, 4]: 1 where the bf16 run's centroid scores tie at the top-k cut.
  meta.json              the target, the head, screening gaps, versions.

The reference is the drafting step of transformers' SinglePositionMultiTokenCandidateGenerator, run on a clean
context: for row t the target runs tokens[0..t] (no cache); the drafter gets cat(target scaled embedding of the
fed token, target final-normed hidden state at t), position_ids t+1, and the target's shared_kv_states sliced to
positions 0..t; each next draft feeds the argmax and the drafter's post_projection output, same position and KV.
(generate()'s own later rounds slice K/V that still holds rejected drafts; that is not the definition matched.)

Two transformers 5.23 bugs are patched here, as the code's own comments intend (patch_kv_sharing_modes):
  1. Gemma4TextConfig.kv_sharing_modes raises when every layer is shared ("the set of layer types producing a
     cache is different"), so no assistant config can be instantiated; Gemma4AssistantConfig's comment says the
     assistant "reuses the shared kvs across all layers": every layer is "reuse".
  2. With num_kv_shared_layers == 0 (12B/26B/31B targets) it returns all None, so the target stores no shared K/V
     for the drafter; its comment says "the last non-consumer layer of each type stores its KV states, even if no
     layer reuses them: assistant models read them": the last layer of each type is "store".

Usage (repository root; needs the target fixtures on disk):
  .venv/bin/python tools/python/make_assistant_fixtures.py           # regenerate all, then verify
  .venv/bin/python tools/python/make_assistant_fixtures.py --verify  # only re-verify what is on disk
"""
import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import torch

import gemma4_fixture_specs as g4_specs
import gemma4_fixture_config as g4_config
import gemma4_fixture_run as g4_run
import gemma4_fixture_w4a16 as g4_w4a16
import gemma4_fixture_weights as g4_weights
import transformers
from safetensors.torch import save_file
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

REPO = Path(__file__).resolve().parents[2]
DRAFTS = 4
S, F = g4_specs.S, g4_specs.F
MAX_ATTEMPTS = 40
MIN_ARGMAX_GAP = 1e-3     # f32 top-2 gap of every draft: float reordering must not flip an argmax
MIN_CLUSTER_GAP = 1e-3    # f32 gap between the k-th and (k+1)-th centroid score: nor a cluster choice

# Drafter text configs: every layer reads the target's K/V, so head_dim / KV heads per layer type are the target's.
E2B_TEXT = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F], sliding_window=8,
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, final_logit_softcapping=30.0,
                pad_token_id=0, bos_token_id=2, eos_token_id=1)
MOE_TEXT = dict(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True, head_dim=16,
                global_head_dim=32, layer_types=[S, F], sliding_window=8, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2,
                eos_token_id=1)
ASSISTANTS = {
    # E2B-like target (KV sharing): layers 3 (sliding) and 2 (full) are the ones the drafter reads. Tied head.
    "assistant_e2b_tied": dict(target="e2b_like", text=E2B_TEXT, backbone=64, ordered=False),
    # The same target, the ordered-embeddings head: 16 clusters of 32 tokens, top 4 scored.
    "assistant_e2b_ordered": dict(target="e2b_like", text=E2B_TEXT, backbone=64, ordered=True, centroids=16, top_k=4),
    # 26B-A4B-like target without KV sharing (its last sliding and full layers are read), attention_k_eq_v.
    "assistant_moe_ordered": dict(target="moe_like", text=MOE_TEXT, backbone=64, ordered=True, centroids=8, top_k=3),
}


def patch_kv_sharing_modes():
    """transformers 5.23 bugs 1 and 2 (module docstring), fixed as the comments in the code intend."""
    def kv_sharing_modes(self):
        n, shared = self.num_hidden_layers, self.num_kv_shared_layers
        first_shared = n - shared
        modes = [None if i < first_shared else "reuse" for i in range(n)]
        if first_shared == 0:           # bug 1: an assistant, every layer reads the target's K/V
            return modes
        producers = self.layer_types[:first_shared]
        if shared and sorted(set(producers)) != sorted(set(self.layer_types)):
            raise ValueError("The set of layer types producing a cache is different than the set of layer types "
                             "using them")
        for kind in set(producers):     # bug 2: also when nothing is shared (shared == 0)
            modes[first_shared - 1 - producers[::-1].index(kind)] = "store"
        return modes
    Gemma4TextConfig.kv_sharing_modes = property(kv_sharing_modes)


def build_assistant(spec):
    text = Gemma4TextConfig(**spec["text"])
    kwargs = dict(num_centroids=spec["centroids"], centroid_intermediate_top_k=spec["top_k"]) if spec["ordered"] else {}
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=spec["backbone"],
                                   use_ordered_embeddings=spec["ordered"], **kwargs)
    model = Gemma4AssistantForCausalLM(config).eval()
    model.set_attn_implementation(g4_specs.ATTN)
    return model


def fill_assistant(model, name, attempt):
    """make_gemma4_fixtures' weight rules; pre/post_projection and the centroids are grid Linears too. The
    token ordering is a seeded permutation of the vocabulary."""
    # is_quant_linear (in fill_weights and write_w4a16) reads the tuple from gemma4_fixture_weights' globals.
    g4_weights.QUANT_LINEARS = tuple(dict.fromkeys(
        g4_weights.QUANT_LINEARS + ("pre_projection", "post_projection", "centroids")))
    kinds, grids = g4_weights.fill_weights(model, g4_weights.seed_for(name) + attempt)
    if model.masked_embedding is not None:
        gen = torch.Generator().manual_seed(g4_weights.seed_for(name, "ordering") + attempt)
        model.masked_embedding.token_ordering.copy_(torch.randperm(model.vocab_size, generator=gen))
    return kinds, grids


def load_target(name, dtype):
    return g4_run.load_model(REPO / "tests" / "fixtures" / name / "bf16", dtype)


def load_assistant(path, dtype):
    model, info = Gemma4AssistantForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=g4_specs.ATTN,
                                                             output_loading_info=True)
    problems = {k: sorted(v)[:5] for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"loading {path}: {problems}")
    return model.eval()


@torch.no_grad()
def target_state(target, tokens):
    """The target's final-normed hidden states [T, Hb], its shared K/V (one pair per layer type, all positions)
    and its argmax at the last position."""
    ids = tokens[None].long()
    out = target.model.language_model(input_ids=ids, use_cache=False, return_shared_kv_states=True)
    logits = target(input_ids=ids, use_cache=False).logits[0]
    return out.last_hidden_state[0], dict(out.shared_kv_states), int(logits[-1].argmax())


@torch.no_grad()
def draft_chains(target, assistant, tokens):
    """[T, DRAFTS, vocab] logits, [T, DRAFTS] ids, and per-draft screening numbers (argmax and cluster gaps)."""
    hidden, kv, last_argmax = target_state(target, tokens)
    embed = target.get_input_embeddings()
    T = tokens.numel()
    scores = []
    hook = None
    if assistant.masked_embedding is not None:
        hook = assistant.masked_embedding.centroids.register_forward_hook(lambda m, a, o: scores.append(o.float()))
    chains, ids, argmax_gaps, cluster_gaps = [], [], [], []
    for t in range(T):
        token = torch.tensor([[int(tokens[t + 1]) if t + 1 < T else last_argmax]])
        context = {k: (v[0][:, :, : t + 1], v[1][:, :, : t + 1]) for k, v in kv.items()}
        state = hidden[None, t : t + 1]
        row, row_ids = [], []
        for _ in range(DRAFTS):
            out = assistant(inputs_embeds=torch.cat([embed(token), state], dim=-1),
                            attention_mask=torch.ones(1, t + 2, dtype=torch.long),
                            position_ids=torch.tensor([[t + 1]]), shared_kv_states=context, use_cache=False)
            logits = out.logits[0, 0]
            token, state = logits.argmax()[None, None], out.last_hidden_state
            top = torch.topk(logits.float(), 2).values
            argmax_gaps.append(float(top[0] - top[1]))
            row.append(logits.float())
            row_ids.append(int(token))
        chains.append(torch.stack(row))
        ids.append(row_ids)
    if hook is not None:
        hook.remove()
        k = assistant.config.centroid_intermediate_top_k
        for s in scores:
            top = torch.topk(s.reshape(-1), k + 1).values
            cluster_gaps.append(float(top[k - 1] - top[k]))
    return torch.stack(chains), torch.tensor(ids, dtype=torch.int32), argmax_gaps, cluster_gaps


def google_style_assistant_config(saved, spec):
    t = dict(saved["text_config"])
    t.pop("per_layer_config", None)
    t["global_head_dim"] = spec["text"]["global_head_dim"]
    t["num_global_key_value_heads"] = spec["text"].get("num_global_key_value_heads")
    t["dtype"] = "bfloat16"
    top = dict(saved, text_config={k: t[k] for k in sorted(t)}, dtype="bfloat16",
               transformers_version=transformers.__version__)
    return {k: top[k] for k in sorted(top)}


def make_fixture(name, spec, root):
    print(f"== {name} (target {spec['target']})")
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    bf16_dir, w4_dir = out / "bf16", out / "w4a16"
    tokens = g4_run.load_safetensors_file(root / spec["target"] / "reference.safetensors")["tokens"]
    target = load_target(spec["target"], torch.float32)
    model = build_assistant(spec)
    for attempt in range(MAX_ATTEMPTS):
        kinds, grids = fill_assistant(model, name, attempt)
        _, _, argmax_gaps, cluster_gaps = draft_chains(target, model, tokens)
        ok = min(argmax_gaps) > MIN_ARGMAX_GAP and (not cluster_gaps or min(cluster_gaps) > MIN_CLUSTER_GAP)
        if ok:
            break
    else:
        raise SystemExit(f"{name}: no robust weights in {MAX_ATTEMPTS} seeds")
    print(f"  attempt {attempt + 1}: min argmax gap {min(argmax_gaps):.4g}, min cluster gap "
          f"{min(cluster_gaps) if cluster_gaps else None}")

    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    saved = json.loads((bf16_dir / "config.json").read_text())
    g4_config.write_json(bf16_dir / "config.json", google_style_assistant_config(saved, spec))
    shutil.copy(root / spec["target"] / "bf16" / "generation_config.json", bf16_dir / "generation_config.json")
    w4_summary = g4_w4a16.write_w4a16(bf16_dir, w4_dir, {k: v for k, v in grids.items()})

    ref = {"tokens": tokens}
    for key, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        chain, ids, _, gaps = draft_chains(load_target(spec["target"], dtype), load_assistant(bf16_dir, dtype), tokens)
        ref[f"chain_{key}"] = chain.to(dtype)
        ref[f"chain_ids_{key}"] = ids
    # Drafts whose bf16 centroid scores tie at the top-k boundary: which cluster transformers' bf16 run takes there
    # is torch.topk's tie order, and an implementation a rounding away may take the other one.
    ties = torch.zeros(ids.shape, dtype=torch.int32)
    if gaps:
        ties = (torch.tensor(gaps).reshape(ids.shape) == 0).to(torch.int32)
    ref["bf16_cluster_tie"] = ties
    save_file({k: v.contiguous() for k, v in ref.items()}, out / "reference.safetensors", metadata={"format": "pt"})
    meta = dict(name=name, target=spec["target"], T=int(tokens.numel()), drafts=DRAFTS,
                head="ordered_embeddings" if spec["ordered"] else "tied",
                text_config=spec["text"], backbone_hidden_size=spec["backbone"],
                num_centroids=spec.get("centroids"), centroid_intermediate_top_k=spec.get("top_k"),
                seed=g4_weights.seed_for(name) + attempt, attempts=attempt + 1,
                min_argmax_gap_f32=min(argmax_gaps), min_cluster_gap_f32=min(cluster_gaps) if cluster_gaps else None,
                chain_ids_f32=ref["chain_ids_f32"].tolist(), chain_ids_bf16=ref["chain_ids_bf16"].tolist(),
                bf16_cluster_ties=ties.nonzero().tolist(),
                weights={k: sum(1 for v in kinds.values() if v == k) for k in sorted(set(kinds.values()))},
                w4a16=w4_summary,
                transformers_patches=["kv_sharing_modes: all-shared config -> every layer 'reuse'",
                                      "kv_sharing_modes: no sharing -> last layer of each type 'store'"],
                versions=dict(torch=torch.__version__, transformers=transformers.__version__),
                generator="tools/python/make_assistant_fixtures.py")
    g4_config.write_json(out / "meta.json", meta)


def verify_fixture(name, spec, root):
    """bf16/ and w4a16/ (dequantized by transformers) reproduce the stored f32 chain; returns failures."""
    out, fails = root / name, []
    ref = g4_run.load_safetensors_file(out / "reference.safetensors")
    target = load_target(spec["target"], torch.float32)
    for what, model in (("bf16/", load_assistant(out / "bf16", torch.float32)),
                        ("w4a16/", Gemma4AssistantForCausalLM.from_pretrained(
                            out / "w4a16", dtype=torch.float32, attn_implementation=g4_specs.ATTN,
                            quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval())):
        for p in model.parameters():   # dequantize returns the scale dtype (bf16): exact in f32
            p.data = p.data.float()
        chain, ids, _, _ = draft_chains(target, model, ref["tokens"])
        worst = float(((chain - ref["chain_f32"]).abs().amax(-1) / ref["chain_f32"].abs().amax(-1)).max())
        print(f"  {what} f32 chain: max relative diff {worst:.3g}, ids equal {torch.equal(ids, ref['chain_ids_f32'])}")
        if worst > 1e-5 or not torch.equal(ids, ref["chain_ids_f32"]):
            fails.append(f"{what}: chain not reproduced ({worst:.3g})")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures")
    ap.add_argument("--only", nargs="*", choices=sorted(ASSISTANTS), default=None)
    ap.add_argument("--verify", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    patch_kv_sharing_modes()
    failures = []
    for name in args.only or list(ASSISTANTS):
        if not args.verify:
            make_fixture(name, ASSISTANTS[name], args.out)
        failures += [f"{name}: {f}" for f in verify_fixture(name, ASSISTANTS[name], args.out)]
    for f in failures:
        print("FAIL", f)
    print("assistant fixtures FAILED" if failures else "assistant fixtures OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
