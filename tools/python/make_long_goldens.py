#!/usr/bin/env python3
"""make_long_goldens.py: transformers' logits far past the sliding window, for tests/long_context_test.cc.

For the committed fixture models (tests/fixtures/<name>/bf16/, made by make_gemma4_fixtures.py), writes
tests/fixtures/<name>/long_reference.safetensors:
  tokens     I32 [T]     BOS, then seeded random ids in [3, vocab)
  positions  I32 [P]     the positions whose logits are kept: every STRIDE-th and the last 4 (all of T's logits
                         would be T x vocab x 4 bytes, megabytes per fixture)
  logits_f32 F32 [P, vocab]  float32 model, eager attention and experts, one forward pass without cache
The fixtures' windows are 8 tokens, so T = 4096 crosses each sliding layer's window 511 times, reaches RoPE
positions 4096 on the proportional-RoPE full layers, and KV-shared layers read their donors' caches at that depth.

With --deep it writes the deeper references of DEEP instead (moe_like and qat_head at 8192 positions, e2b_like at
32768, long_like, a one-head model made for it, at 131072 = its max_position_embeddings), run in chunks of 2048
through transformers' own cache (whose logits agree with one pass within 2.4e-6 of the peak at 4096), so no T x T
attention matrix is held.

Usage (from the repository root; ~1 minute a fixture on 2 cores; --deep: see DEEP's costs):
  .venv/bin/python tools/python/make_long_goldens.py            # writes every fixture's long reference
  .venv/bin/python tools/python/make_long_goldens.py --only e2b_like
  .venv/bin/python tools/python/make_long_goldens.py --deep
Deterministic on one machine (fixed seed, one thread); on another CPU torch may sum in another order, which the
C++ test's tolerance (5e-6 of each position's peak |logit|, as the short goldens) absorbs.
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NAMES = ["e2b_like", "moe_like", "qat_head"]  # KV sharing + PLE, MoE + attention_k_eq_v, dense
T, STRIDE, SEED = 4096, 128, 4141
# Deeper references, one fixture each (the C++ test's time grows with the square of the length):
# name: (T, STRIDE, output file); computed by transformers in chunks through its own KV cache. Cost on the 2-core VM
# (one torch thread, wall, beside other jobs): 8192 ~30-40 s, 32768 ~5 min, 131072 ~16 min and 4.2 GB peak.
DEEP = {"moe_like": (8192, 256, "long_reference_8k.safetensors"),
        "qat_head": (8192, 256, "long_reference_8k.safetensors"),
        "e2b_like": (32768, 1024, "long_reference_32k.safetensors"),
        "long_like": (131072, 4096, "long_reference_128k.safetensors")}
CHUNK = 2048


def load(path):
    cls = getattr(transformers, json.loads((path / "config.json").read_text())["architectures"][0])
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    return model.eval()


def positions(t=T, stride=STRIDE):
    return sorted(set(range(stride - 1, t, stride)) | set(range(t - 4, t)))


@torch.no_grad()
def kept_logits_chunked(model, tokens, keep):
    """The logits at `keep` of one sequence run in chunks of CHUNK through transformers' cache (sliding layers keep
    their windows), so the attention scores of a chunk, not of the whole sequence, are held at once."""
    from transformers import DynamicCache
    cache, out = DynamicCache(config=model.config), []
    for at in range(0, len(tokens), CHUNK):
        chunk = tokens[at:at + CHUNK][None].long()
        logits = model(input_ids=chunk, past_key_values=cache, use_cache=True).logits[0].float()
        out += [logits[p - at] for p in keep if at <= p < at + CHUNK]
    return torch.stack(out)


@torch.no_grad()
def make_deep(name):
    t, stride, file = DEEP[name]
    path = FIXTURES / name / "bf16"
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    vocab, bos = text["vocab_size"], text.get("bos_token_id", config.get("bos_token_id", 2))
    g = torch.Generator().manual_seed(SEED + t)
    tokens = torch.cat([torch.tensor([bos]), torch.randint(3, vocab, (t - 1,), generator=g)]).to(torch.int32)
    keep = positions(t, stride)
    logits = kept_logits_chunked(load(path), tokens, keep)
    out = FIXTURES / name / file
    save_file({"tokens": tokens, "positions": torch.tensor(keep, dtype=torch.int32), "logits_f32": logits.contiguous()},
              str(out), metadata={"T": str(t), "stride": str(stride), "seed": str(SEED + t), "chunk": str(CHUNK),
                                  "transformers": transformers.__version__, "torch": torch.__version__})
    print(f"{name}: T {t}, {len(keep)} positions kept, peak |logit| {float(logits.abs().max()):.3f} -> {out}")


@torch.no_grad()
def make(name):
    path = FIXTURES / name / "bf16"
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    vocab, bos = text["vocab_size"], text.get("bos_token_id", config.get("bos_token_id", 2))
    g = torch.Generator().manual_seed(SEED)
    tokens = torch.cat([torch.tensor([bos]), torch.randint(3, vocab, (T - 1,), generator=g)]).to(torch.int32)
    model = load(path)
    logits = model(input_ids=tokens[None].long(), use_cache=False).logits[0].float()
    keep = torch.tensor(positions(), dtype=torch.int32)
    out = FIXTURES / name / "long_reference.safetensors"
    save_file({"tokens": tokens, "positions": keep, "logits_f32": logits[keep.long()].contiguous()}, str(out),
              metadata={"T": str(T), "stride": str(STRIDE), "seed": str(SEED), "transformers": transformers.__version__,
                        "torch": torch.__version__})
    print(f"{name}: T {T}, {len(keep)} positions kept, peak |logit| {float(logits.abs().max()):.3f} -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(set(NAMES) | set(DEEP)))
    ap.add_argument("--deep", action="store_true", help="write the deeper references (DEEP) instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name in [args.only] if args.only else NAMES if not args.deep else DEEP:
        if not args.deep:
            make(name)
        elif name in DEEP:
            make_deep(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
