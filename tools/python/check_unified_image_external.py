"""src/media's 12B image path against torchvision 0.29 and transformers' Gemma4UnifiedImageProcessor, bit for bit.

usage: check_unified_image_external.py MEDIA_PROBE

1. resize: media_probe's torch-exact bicubic resize vs torchvision.transforms.v2.functional.resize(uint8 tensor,
   BICUBIC, antialias=True) on 1- and 3-channel images of odd, tiny, extreme and ordinary sizes, up and down.
2. preprocess: pixel_values, image_position_ids and num_soft_tokens_per_image from Gemma4UnifiedImageProcessor on
   image_cases.decode_cases() (RGBA, grayscale, palette, 16-bit, CMYK... converted to RGB) and on larger images
   (down- and upscaled, extreme aspect ratios, max_soft_tokens 70/280/1120), equal as float32 bits; HF's padding
   rows are checked to be zeros with positions -1.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as tvF
from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor

sys.path.insert(0, str(Path(__file__).parent))
import image_cases  # noqa: E402
from check_image_external import PREPROCESS_SIZES, RESIZE_CASES, preprocess_runs, run_probe  # noqa: E402


def torchvision_resize(pixels, ow, oh):
    chw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
    out = tvF.resize(chw, [oh, ow], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
    return out.permute(1, 2, 0).contiguous().numpy().reshape(-1)


def check_resize(probe, tmp):
    failures, total = 0, 0
    for i, (w, h, ow, oh) in enumerate(RESIZE_CASES + [(45, 71, 48, 96), (97, 33, 144, 48), (50, 50, 48, 48)]):
        for channels in (1, 3):
            pixels = image_cases.pattern(w, h, channels, 100 + i).reshape(h, w, channels)
            try:
                expected = torchvision_resize(pixels, ow, oh)
            except RuntimeError as e:  # torch's AVX kernel asserts on some 1-pixel sides: nothing to compare
                print(f"  skipped {channels}ch {w}x{h} -> {ow}x{oh}: torchvision fails ({str(e).splitlines()[0][:80]})")
                continue
            total += 1
            src, dst = tmp / "in.raw", tmp / "out.raw"
            src.write_bytes(pixels.tobytes())
            r = run_probe(probe, "resize", src, dst, w, h, channels, ow, oh, "--torch")
            got = np.frombuffer(dst.read_bytes(), np.uint8) if r.returncode == 0 else None
            if got is None or got.shape != expected.shape or not np.array_equal(got, expected):
                if got is None or got.shape != expected.shape:
                    diff = "error: " + r.stderr
                else:
                    d = np.abs(got.astype(int) - expected.astype(int))
                    diff = f"{int((d > 0).sum())} of {d.size} bytes differ, by at most {int(d.max())}"
                print(f"FAIL resize {channels}ch {w}x{h} -> {ow}x{oh}: {diff}")
                failures += 1
    print(f"resize: {total - failures}/{total} bit-exact with torchvision")
    return failures


def check_preprocess(probe, tmp, cases):
    failures, count = 0, 0
    sizes = PREPROCESS_SIZES + [(45, 71), (97, 33), (333, 97)]
    for name, max_soft_tokens, ref, info, values, positions in preprocess_runs(
        probe, tmp, cases, sizes, Gemma4UnifiedImageProcessor, "--unified"
    ):
        count += 1
        if info is None:
            failures += 1
            continue
        n = info["num_patches"]
        ref_values, ref_positions = ref["pixel_values"][0], ref["image_position_ids"][0]
        problems = []
        if int(ref["num_soft_tokens_per_image"][0]) != info["num_soft_tokens"] or n != info["num_soft_tokens"]:
            problems.append(f"num_soft_tokens {info['num_soft_tokens']} vs {ref['num_soft_tokens_per_image'][0]}")
        elif ref_values.dtype != np.float32 or ref_values.shape[1] != values.shape[1]:
            problems.append(f"pixel_values {ref_values.dtype} {ref_values.shape} vs float32 {values.shape}")
        elif not np.array_equal(ref_values[:n].view(np.uint32), values.view(np.uint32)):
            d = np.abs(ref_values[:n] - values)
            problems.append(f"pixel_values: {int((d > 0).sum())} differ, by at most {float(d.max()):.3g}")
        if not np.array_equal(ref_positions[:n], positions):
            problems.append("position ids differ")
        if np.any(ref_values[n:] != 0) or np.any(ref_positions[n:] != -1) or ref_values.shape[0] != max_soft_tokens:
            problems.append("HF's rows past num_soft_tokens are not its zero/-1 padding")
        if problems:
            print(f"FAIL preprocess {name} ({max_soft_tokens}): {'; '.join(problems)}")
            failures += 1
    print(f"preprocess: {count - failures}/{count} equal to Gemma4UnifiedImageProcessor (float32 bits)")
    return failures


def main():
    probe = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        failures = check_resize(probe, tmp)
        failures += check_preprocess(probe, tmp, image_cases.decode_cases())
    print("unified_image_external:", "OK" if failures == 0 else f"{failures} FAILED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
