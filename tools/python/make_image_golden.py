"""Writes the committed image fixtures: a few files from image_cases.py in tests/data/images/ (and rejected ones in
tests/data/images/bad/), and tests/golden/image_golden.json with what Pillow 12.3 and transformers 5.23 make of them:
the decoded RGB (transformers' convert_to_rgb of Image.open), Pillow bicubic resizes of it, and
Gemma4ImageProcessorPil's outputs at max_soft_tokens 70, as FNV-1a 64-bit hashes of the raw bytes (float32
little-endian for pixel values, int32 for positions) plus a few values. tests/image_media_test.cc checks src/media
against them without Python.

usage: .venv/bin/python tools/python/make_image_golden.py
"""

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from transformers.image_transforms import convert_to_rgb
from transformers.models.gemma4.image_processing_pil_gemma4 import (
    Gemma4ImageProcessorPil,
    get_aspect_ratio_preserving_size,
)

sys.path.insert(0, str(Path(__file__).parent))
import image_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FILES = ["rgba.png", "interlaced.png", "rgba16_interlaced.png", "palette_alpha.png", "gray16.png", "gray2bit.png", "rgb_key.png", "rgb.jpg", "cmyk.jpg",
         "transparent.gif", "offset_frame.gif", "lossless_alpha.webp", "lossy.webp"]
BAD = ["png_bomb", "png_pixel_bomb", "png_zero_width", "gif_zero_size", "png_truncated", "jpeg_truncated"]
RESIZES = [(48, 48), (11, 7), (1, 1), (96, 5), (3, 200)]
SIZES = [(23, 37), (1, 1), (2000, 50), (20, 3000), (480, 640), (768, 768), (211, 1003)]  # (height, width)


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    images_dir = ROOT / "tests/data/images"
    (images_dir / "bad").mkdir(parents=True, exist_ok=True)
    cases = dict(image_cases.decode_cases())
    processor = Gemma4ImageProcessorPil(max_soft_tokens=70)
    golden = {"pillow": Image.__version__, "max_soft_tokens": 70, "images": [], "bad": [], "sizes": []}
    for name in FILES:
        path = images_dir / name
        path.write_bytes(cases[name])
        with Image.open(path) as im:
            rgb = convert_to_rgb(im, return_numpy=True)
            ref = processor(images=im, return_tensors="np")
        n = int(ref["num_soft_tokens_per_image"][0]) * 9
        values = np.ascontiguousarray(ref["pixel_values"][0][:n], dtype="<f4")
        positions = np.ascontiguousarray(ref["image_position_ids"][0][:n], dtype="<i4")
        resizes = []
        for w, h in RESIZES:
            out = np.asarray(Image.fromarray(rgb, "RGB").resize((w, h), Image.Resampling.BICUBIC))
            resizes.append({"width": w, "height": h, "fnv1a64": fnv1a64(out.tobytes())})
        golden["images"].append({
            "file": name, "width": rgb.shape[1], "height": rgb.shape[0], "rgb_fnv1a64": fnv1a64(rgb.tobytes()),
            "resizes": resizes, "num_patches": n, "num_soft_tokens": n // 9,
            "pixel_values_fnv1a64": fnv1a64(values.tobytes()), "position_ids_fnv1a64": fnv1a64(positions.tobytes()),
            "first_values": [float(v) for v in values.reshape(-1)[:6]],
        })
    for name, data, _mime, fragment in image_cases.bad_cases(list(cases.items())):
        if name in BAD:
            (images_dir / "bad" / name).write_bytes(data)
            golden["bad"].append({"file": name, "message": fragment})
    for h, w in SIZES:
        th, tw = get_aspect_ratio_preserving_size(h, w, patch_size=16, max_patches=280 * 9, pooling_kernel_size=3)
        golden["sizes"].append({"height": h, "width": w, "target_height": th, "target_width": tw})
    out = ROOT / "tests/golden/image_golden.json"
    out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {out} and {len(FILES)} + {len(BAD)} files in {images_dir}")


if __name__ == "__main__":
    main()
