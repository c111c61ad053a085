#!/usr/bin/env python3
"""make_random_lora.py: a seeded random LoRA adapter in PEFT's saved form for any Gemma 4 checkpoint, full-size ones
included, without loading the model (PEFT's get_peft_model would need the whole model in memory): the shapes come
from the checkpoint's safetensors headers, bf16 (`*.weight` [out, in]) or compressed-tensors w4a16
(`*.weight_shape` = [out, in], or `*.weight_packed` [out, in / 8]).

Writes OUT/adapter_config.json and OUT/adapter_model.safetensors with PEFT's key names
(`base_model.model.<module>.lora_A.weight` [r, in], `lora_B.weight` [out, r], bf16) for every text-decoder linear
whose last name is in --targets. For benchmarks (`qatserve bench --lora`); tests use PEFT itself
(tests/server/test_lora_server.py, tools/python/check_lora_external.py).

  .venv/bin/python tools/python/make_random_lora.py --model e2b-w4 --rank 16 --out lora-r16
"""
import argparse
import json
import re
import struct
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ATTENTION_MLP = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
LINEAR = re.compile(r"^(model\.(?:language_model\.)?layers\.\d+\.(?:self_attn|mlp)\.(\w+))\.(weight|weight_shape|weight_packed)$")


def headers(model):
    """(name, dtype, shape) of every tensor in the checkpoint's safetensors files."""
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            for name, info in json.loads(fh.read(n)).items():
                if name != "__metadata__":
                    yield name, info["dtype"], info["shape"]


def linear_shapes(model, targets):
    """{module: (out, in)} of the text decoder's linears whose last name is in targets."""
    shapes = {}
    for name, _, shape in headers(model):
        m = LINEAR.match(name)
        if not m or m.group(2) not in targets:
            continue
        module, kind = m.group(1), m.group(3)
        if kind == "weight":
            shapes[module] = (shape[0], shape[1])
        elif kind == "weight_packed":
            shapes.setdefault(module, (shape[0], shape[1] * 8))
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="checkpoint directory (bf16 or w4a16)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=None, help="lora_alpha (default: the rank)")
    ap.add_argument("--targets", default=ATTENTION_MLP, help=f"comma-separated module names (default {ATTENTION_MLP})")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    targets = args.targets.split(",")
    shapes = linear_shapes(args.model, set(targets))
    if not shapes:
        sys.exit(f"{args.model}: no text-decoder linear named {targets} in its safetensors files")
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for module, (out, inp) in sorted(shapes.items()):
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = (torch.randn(args.rank, inp, generator=gen) / inp ** 0.5).bfloat16()
        tensors[f"{key}.lora_B.weight"] = (torch.randn(out, args.rank, generator=gen) * 0.01).bfloat16()
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": args.rank,
              "lora_alpha": args.alpha if args.alpha is not None else args.rank, "target_modules": targets,
              "bias": "none", "use_rslora": False, "lora_dropout": 0.0, "base_model_name_or_path": str(args.model.name)}
    (args.out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{args.out}: rank {args.rank} on {len(shapes)} linears, "
          f"{sum(t.numel() for t in tensors.values()) * 2 / 1e6:.1f} MB as bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
