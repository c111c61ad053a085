#!/usr/bin/env python3
"""check_ct_grid_external.py SRC DST: `qatserve repack --grid ct-7.5` against compressed-tensors' own quantizer.

For every module DST packs, the source bf16 weight (SRC, fused experts split as the repack splits them) is
quantized by compressed-tensors 0.20 itself, as its symmetric int4 group-32 minmax rule does (what Google's w4a16
export uses): per-group min/max -> calculate_qparams (scale = max|w| / 7.5 in the weight's dtype, bf16; eps for a
zero group) -> quantize (bf16 w / scale, clamp, round half to even). The int4 codes DST stores (unpacked by
compressed-tensors' unpack_from_int32) must equal those codes exactly, and DST's weight_scale those scales bit for
bit. Exit 0 when all match, 1 otherwise.
"""
import sys

import torch
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams

from check_repack_external import GROUP, expected_from_src
from checkpoint_dir import load_safetensors

ARGS = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)


def ct_codes_and_scales(w):
    groups = w.reshape(w.shape[0], -1, GROUP)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), ARGS)
    return quantize(w, scale, zero_point, ARGS, dtype=torch.int8), scale


def main(src_dir, dst_dir):
    src, dst = expected_from_src(load_safetensors(src_dir)), load_safetensors(dst_dir)
    modules = sorted(n[: -len(".weight_packed")] for n in dst if n.endswith(".weight_packed"))
    failures, codes_total, codes_same, zero_groups = [], 0, 0, 0
    for m in modules:
        w = src[m + ".weight"]
        want_codes, want_scale = ct_codes_and_scales(w)
        codes = unpack_from_int32(dst[m + ".weight_packed"], 4, torch.Size(w.shape)).to(torch.int8)
        scale = dst[m + ".weight_scale"]
        codes_total += codes.numel()
        codes_same += int((codes == want_codes).sum())
        # An all-zero group: compressed-tensors stores bf16's eps, the codes are 0 either way.
        zero_groups += int((w.reshape(w.shape[0], -1, GROUP).abs().amax(-1) == 0).sum())
        if not torch.equal(codes, want_codes):
            failures.append(f"{m}: {int((codes != want_codes).sum())} int4 codes differ from compressed-tensors'")
        if not torch.equal(scale.view(torch.int16), want_scale.to(torch.bfloat16).view(torch.int16)):
            failures.append(f"{m}: {int((scale != want_scale).sum())} scales differ from compressed-tensors'")
    print(f"compressed-tensors amax/7.5 quantizer vs DST: {len(modules)} modules, {codes_same}/{codes_total} int4 "
          f"codes equal, {zero_groups} all-zero groups")
    for f in failures[:20]:
        print("FAIL", f)
    if failures or not modules:
        print(f"FAILED: {len(failures)} problem(s)" if modules else "FAILED: DST packs nothing")
        return 1
    print("OK: DST holds compressed-tensors' own int4 codes and scales")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
