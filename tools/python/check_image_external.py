"""src/media's image path against Pillow 12.3 and transformers' Gemma4ImageProcessorPil, bit for bit.

usage: check_image_external.py MEDIA_PROBE

1. resize: media_probe's bicubic resize vs PIL.Image.resize(BICUBIC) on L and RGB images of odd, tiny, extreme and
   ordinary sizes, up and down (both passes, the >100:1 tall path, one-pixel sides).
2. decode: every case of image_cases.decode_cases() vs transformers' own conversion of Pillow's image
   (image_transforms.convert_to_rgb: alpha composited onto white), after Image.open.
3. preprocess: pixel_values, image_position_ids and num_soft_tokens_per_image from Gemma4ImageProcessorPil on those
   images and on larger ones (down- and upscaled, extreme aspect ratios, max_soft_tokens 70/280/1120), equal as
   float32 bits; HF's padding rows are checked to be zeros with positions -1.
4. rejection: empty, unknown, truncated and corrupt files, a PNG decompression bomb, zero sizes and a wrong declared
   MIME type exit 1 with a message naming the input.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image
from transformers.image_transforms import convert_to_rgb
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

sys.path.insert(0, str(Path(__file__).parent))
import image_cases  # noqa: E402

RESIZE_CASES = [
    # (width, height, out_width, out_height)
    (37, 23, 48, 48), (37, 23, 11, 7), (1, 1, 5, 3), (1, 40, 1, 13), (40, 1, 3, 1), (2, 2, 1, 1),
    (64, 48, 768, 576), (300, 200, 96, 48), (251, 199, 144, 96), (7, 500, 3, 41), (500, 7, 43, 2),
    (3, 400, 3, 37), (2, 401, 5, 9), (123, 45, 123, 17), (123, 45, 17, 45), (99, 101, 100, 100),
    (640, 480, 624, 480), (513, 257, 1007, 509),
]

PREPROCESS_SIZES = [(37, 23), (1, 1), (48, 48), (768, 768), (800, 600), (1003, 211), (50, 2000), (3000, 20),
                    (641, 479)]


def run_probe(probe, *args):
    return subprocess.run([probe, *map(str, args)], capture_output=True, text=True)


def check_resize(probe, tmp):
    failures = 0
    for i, (w, h, ow, oh) in enumerate(RESIZE_CASES):
        for mode, channels in (("L", 1), ("RGB", 3)):
            pixels = image_cases.pattern(w, h, channels, 100 + i)
            image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
            expected = np.asarray(image.resize((ow, oh), Image.Resampling.BICUBIC)).reshape(-1)
            src, dst = tmp / "in.raw", tmp / "out.raw"
            src.write_bytes(pixels.tobytes())
            r = run_probe(probe, "resize", src, dst, w, h, channels, ow, oh)
            got = np.frombuffer(dst.read_bytes(), np.uint8) if r.returncode == 0 else None
            if got is None or got.shape != expected.shape or not np.array_equal(got, expected):
                diff = "error: " + r.stderr if got is None else f"{int((got != expected).sum())} bytes differ"
                print(f"FAIL resize {mode} {w}x{h} -> {ow}x{oh}: {diff}")
                failures += 1
    print(f"resize: {2 * len(RESIZE_CASES) - failures}/{2 * len(RESIZE_CASES)} bit-exact with Pillow")
    return failures


def hf_rgb(path):
    with Image.open(path) as im:
        return convert_to_rgb(im, return_numpy=True)


def check_decode(probe, tmp, cases):
    failures = 0
    for name, data in cases:
        path = tmp / name
        path.write_bytes(data)
        expected = hf_rgb(path)
        r = run_probe(probe, "decode", path, tmp / "out.rgb")
        if r.returncode != 0:
            print(f"FAIL decode {name}: {r.stderr.strip()}")
            failures += 1
            continue
        info = json.loads(r.stdout)
        got = np.frombuffer((tmp / "out.rgb").read_bytes(), np.uint8).reshape(info["height"], info["width"], 3)
        if got.shape != expected.shape:
            print(f"FAIL decode {name}: {got.shape} vs Pillow {expected.shape}")
            failures += 1
        elif not np.array_equal(got, expected):
            d = np.abs(got.astype(int) - expected.astype(int))
            print(f"FAIL decode {name}: {int((d > 0).sum())} of {d.size} values differ, max {int(d.max())}")
            failures += 1
    print(f"decode: {len(cases) - failures}/{len(cases)} equal to Pillow + transformers' convert_to_rgb")
    return failures


def preprocess_runs(probe, tmp, cases, sizes, processor_class, *probe_args):
    """Every case (at budget 280) and a pattern image of each of `sizes` (at 280, 70 and 1120) through the HF
    processor and through media_probe's preprocess. Yields (name, max_soft_tokens, ref, info, values, positions),
    info None when the probe failed (already printed)."""
    extra = []
    for i, (w, h) in enumerate(sizes):
        buf = tmp / f"size_{w}x{h}.png"
        Image.fromarray(image_cases.pattern(w, h, 3, 200 + i), "RGB").save(buf)
        extra.append((buf.name, buf.read_bytes()))
    for max_soft_tokens in (280, 70, 1120):
        config = tmp / f"processor_config_{max_soft_tokens}.json"
        config.write_text(json.dumps({"image_processor": {"max_soft_tokens": max_soft_tokens, "resample": 3}}))
        processor = processor_class(max_soft_tokens=max_soft_tokens)
        for name, data in cases + extra if max_soft_tokens == 280 else extra:
            path = tmp / name
            path.write_bytes(data)
            with Image.open(path) as im:
                ref = processor(images=im, return_tensors="np")
            out_dir = tmp / "pre"
            out_dir.mkdir(exist_ok=True)
            r = run_probe(probe, "preprocess", path, out_dir, "--config", config, *probe_args)
            if r.returncode != 0:
                print(f"FAIL preprocess {name} ({max_soft_tokens}): {r.stderr.strip()}")
                yield name, max_soft_tokens, ref, None, None, None
                continue
            info = json.loads(r.stdout)
            n = info["num_patches"]
            values = np.frombuffer((out_dir / "pixel_values.f32").read_bytes(), np.float32).reshape(n, -1)
            positions = np.frombuffer((out_dir / "position_ids.i32").read_bytes(), np.int32).reshape(n, 2)
            yield name, max_soft_tokens, ref, info, values, positions


def check_preprocess(probe, tmp, cases):
    failures, count = 0, 0
    for name, max_soft_tokens, ref, info, values, positions in preprocess_runs(
        probe, tmp, cases, PREPROCESS_SIZES, Gemma4ImageProcessorPil
    ):
        count += 1
        if info is None:
            failures += 1
            continue
        n = info["num_patches"]
        ref_values, ref_positions = ref["pixel_values"][0], ref["image_position_ids"][0]
        problems = []
        if int(ref["num_soft_tokens_per_image"][0]) != info["num_soft_tokens"]:
            problems.append(f"num_soft_tokens {info['num_soft_tokens']} vs {ref['num_soft_tokens_per_image'][0]}")
        if ref_values.dtype != np.float32 or not np.array_equal(
            ref_values[:n].view(np.uint32), values.view(np.uint32)
        ):
            problems.append("pixel_values differ")
        if not np.array_equal(ref_positions[:n], positions):
            problems.append("position ids differ")
        if np.any(ref_values[n:] != 0) or np.any(ref_positions[n:] != -1) or ref_values.shape[0] != 9 * max_soft_tokens:
            problems.append("HF's rows past num_patches are not its zero/-1 padding")
        if problems:
            print(f"FAIL preprocess {name} ({max_soft_tokens}): {'; '.join(problems)}")
            failures += 1
    print(f"preprocess: {count - failures}/{count} equal to Gemma4ImageProcessorPil (float32 bits)")
    return failures


def check_rejections(probe, tmp, cases):
    failures = 0
    bad = image_cases.bad_cases(cases)
    for name, data, mime, fragment in bad:
        path = tmp / f"bad_{name}"
        path.write_bytes(data)
        args = ["decode", path, tmp / "out.rgb"] + (["--mime", mime] if mime else [])
        r = run_probe(probe, *args)
        message = r.stderr.strip()
        if r.returncode != 1 or str(path) not in message or fragment not in message:
            print(f"FAIL reject {name}: exit {r.returncode}, message {message!r} (wanted {fragment!r})")
            failures += 1
        else:
            print(f"  rejected {name}: {message}")
    print(f"rejection: {len(bad) - failures}/{len(bad)} refused with a message naming the input")
    return failures


def main():
    probe = sys.argv[1]
    cases = image_cases.decode_cases()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        failures = check_resize(probe, tmp)
        failures += check_decode(probe, tmp, cases)
        failures += check_preprocess(probe, tmp, cases)
        failures += check_rejections(probe, tmp, cases)
    print("image_external:", "OK" if failures == 0 else f"{failures} FAILED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
