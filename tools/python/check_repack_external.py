#!/usr/bin/env python3
"""check_repack_external.py SRC DST: prove `qatserve repack` lossless with third-party code only.

DST (compressed-tensors pack-quantized W4A16) is decompressed by the compressed-tensors package itself
(CompressedTensorsDequantizer: validates DST's quantization_config with the package's pydantic model, then
runs PackedQuantizationCompressor.decompress = unpack_from_int32 + dequantize on every module that holds a
weight_packed, and fails on qparams left over). Both checkpoints are read with the safetensors package.
Then every SRC tensor must come back: quantized weights within 2^-7 of their group's max |value| (bit-identical
is what a lossless repack gives), everything else byte-identical, fused experts split with gate = first I rows.
"""
import json
import sys
from pathlib import Path

import torch
from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer

from checkpoint_dir import load_safetensors
from gemma4_expert_merge import per_expert_tensors

GROUP = 32            # QAT group: 32 consecutive input columns share one step
TOLERANCE = 2.0**-7   # bf16 rounding, relative to the group's max |value| (reference §4.3)


def expected_from_src(src):
    """SRC as DST should decompress to: fused experts [E,2I,H] / [E,H,I] become per-expert Linear weights."""
    out = {}
    for name, t in src.items():
        out.update(per_expert_tensors(name, t))
    return out


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def bits(t):
    """One row of raw bytes per value, so that equality is bit equality (-0 != +0, NaN == same NaN)."""
    return t.contiguous().reshape(-1).view(torch.uint8).reshape(t.numel(), -1)


def main(src_dir, dst_dir):
    src, dst = load_safetensors(src_dir), load_safetensors(dst_dir)
    quantized = {n[: -len(".weight_packed")] + ".weight" for n in dst if n.endswith(".weight_packed")}
    # The package's own model-free decompression; it rejects a config it cannot parse and leftover qparams.
    try:
        decompressed = CompressedTensorsDequantizer(dst_dir, dtype=torch.bfloat16).validate(dict(dst))
    except Exception as e:  # noqa: BLE001 - any refusal by the third-party reader is the finding
        print(f"FAILED: compressed-tensors refused DST: {type(e).__name__}: {e} ({e.__cause__ or ''})")
        return 1
    expected = expected_from_src(src)

    failures = []
    # A tied lm_head that equals the embedding may be dropped by repack (reference §3: accept its absence).
    config = json.loads((Path(src_dir) / "config.json").read_text())
    embed = expected.get("model.language_model.embed_tokens.weight")
    if "lm_head.weight" in expected and "lm_head.weight" not in decompressed and config.get("tie_word_embeddings") \
            and embed is not None and same_bytes(expected["lm_head.weight"], embed):
        del expected["lm_head.weight"]
    failures += [f"missing in DST: {n}" for n in sorted(expected.keys() - decompressed.keys())]
    failures += [f"extra in DST: {n}" for n in sorted(decompressed.keys() - expected.keys())]

    values = identical = copied = copied_same = split = 0
    max_err = 0.0
    for name in sorted(expected.keys() & decompressed.keys()):
        want, got = expected[name], decompressed[name]
        if name not in quantized:
            copied += 1
            if same_bytes(want, got):
                copied_same += 1
            else:
                failures.append(f"copied tensor differs: {name}")
            continue
        split += ".experts." in name
        if want.shape != got.shape:
            failures.append(f"{name}: dequantized shape {list(got.shape)} != source {list(want.shape)}")
            continue
        w, g = want.float().reshape(want.shape[0], -1, GROUP), got.float().reshape(want.shape[0], -1, GROUP)
        err = (g - w).abs()
        bound = w.abs().amax(dim=-1, keepdim=True) * TOLERANCE
        values += w.numel()
        identical += int(bits(want).eq(bits(got.to(want.dtype))).all(dim=-1).sum())
        max_err = max(max_err, float(err.max()))
        if bool((err > bound).any()):
            bad = int((err > bound).sum())
            failures.append(f"{name}: {bad} values off by more than 2^-7 of their group's max |value|")

    print(f"compressed-tensors decompress: {len(quantized)} quantized modules ({split} from split experts), "
          f"{values} values, {identical} bit-identical ({100.0 * identical / max(values, 1):.2f} %), "
          f"max abs error {max_err:.3g}; {copied_same}/{copied} copied tensors byte-identical")
    for f in failures[:20]:
        print("FAIL", f)
    if failures:
        print(f"FAILED: {len(failures)} problem(s)")
        return 1
    print("OK: DST reproduces SRC")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
