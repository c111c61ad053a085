"""Deterministic test images in every format and mode the image path handles (written with Pillow 12.3), shared by
check_image_external.py (live checks) and make_image_golden.py (the committed fixtures)."""

import io
import struct
import zlib

import numpy as np
from PIL import Image


def pattern(width, height, channels, seed):
    """Smooth gradients plus noise: structure for JPEG/WebP and every level for exactness checks."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    planes = []
    for c in range(channels):
        wave = 127.5 + 100 * np.sin((x * (c + 1) + 2 * y) / max(3.0, width / 7)) * np.cos(y / max(2.0, height / 5))
        planes.append(wave + rng.normal(0, 25, size=(height, width)))
    return np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)


def _save(image, fmt, **kwargs):
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _alpha(width, height, seed):
    """An alpha plane with fully transparent, fully opaque and partial regions."""
    a = pattern(width, height, 1, seed)[..., 0]
    a[: height // 3] = 0
    a[height // 3 : height // 2] = 255
    return a


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_with_header(width, height, bit_depth=8, color_type=2, idat=b"", interlace=0):
    """A PNG whose IHDR says width x height, with the given (possibly empty) IDAT payload."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    body = png_chunk(b"IHDR", ihdr)
    if idat is not None:
        body += png_chunk(b"IDAT", idat)
    return b"\x89PNG\r\n\x1a\n" + body + png_chunk(b"IEND", b"")


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def raw_png(samples, color_type, interlace=False):
    """A PNG of 8- or 16-bit samples [H, W, C] written by hand (Pillow writes neither 16-bit colour nor Adam7)."""
    height, width = samples.shape[:2]
    big_endian = samples.astype(">u2") if samples.dtype == np.uint16 else samples

    def rows(image):
        return b"".join(b"\0" + row.tobytes() for row in image)

    if interlace:
        raw = b"".join(rows(big_endian[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7
                       if big_endian[y0::dy, x0::dx].size)
    else:
        raw = rows(big_endian)
    depth = 16 if samples.dtype == np.uint16 else 8
    return png_with_header(width, height, depth, color_type, zlib.compress(raw), interlace=int(interlace))


def gray_2bit_png(gray):
    """Sub-byte grayscale (Pillow writes none): 2-bit samples, four to a byte, a filter byte per row."""
    height, width = gray.shape
    levels = (gray >> 6).astype(np.uint8)
    padded = np.zeros((height, (width + 3) // 4 * 4), np.uint8)
    padded[:, :width] = levels
    packed = (padded[:, 0::4] << 6) | (padded[:, 1::4] << 4) | (padded[:, 2::4] << 2) | padded[:, 3::4]
    raw = b"".join(b"\0" + row.tobytes() for row in packed)
    return png_with_header(width, height, bit_depth=2, color_type=0, idat=zlib.compress(raw))


def gif_first_frame_offset():
    """A GIF whose first frame is smaller than the screen, offset, with a transparent index and a local palette."""
    im = Image.fromarray(pattern(7, 5, 1, 40)[..., 0] // 64, "L").convert("P")
    frame = _save(im, "GIF", transparency=1)
    # Rewrite the logical screen to 12x9 and the image descriptor's position to (3, 2).
    data = bytearray(frame)
    data[6:10] = struct.pack("<HH", 12, 9)
    desc = _first_image_descriptor(frame)
    data[desc + 1 : desc + 5] = struct.pack("<HH", 3, 2)
    return bytes(data)


def _first_image_descriptor(gif):
    palette = 3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0
    return gif.index(b",", 13 + palette)


def gif_zero_size(gif):
    """The screen and the first frame both 0x0."""
    data = bytearray(gif)
    data[6:10] = struct.pack("<HH", 0, 0)
    desc = _first_image_descriptor(gif)
    data[desc + 5 : desc + 9] = struct.pack("<HH", 0, 0)
    return bytes(data)


def decode_cases():
    """(name, bytes) for every decoder path: PNG modes incl. palette, tRNS, 16-bit, sub-byte gray; JPEG gray, 4:2:0,
    4:4:4, progressive, CMYK; GIF with and without transparency, animated (first frame); WebP lossless and lossy, with and without alpha."""
    rgb = pattern(37, 23, 3, 1)
    rgba = np.dstack([pattern(29, 31, 3, 2), _alpha(29, 31, 3)])
    gray = pattern(33, 17, 1, 4)[..., 0]
    cases = []
    cases.append(("rgb.png", _save(Image.fromarray(rgb, "RGB"), "PNG")))
    cases.append(("rgba.png", _save(Image.fromarray(rgba, "RGBA"), "PNG")))
    levels = np.arange(256, dtype=np.uint8)
    sweep = np.dstack([np.tile(levels, (256, 1)), np.tile(levels, (256, 1))[::-1], np.tile(levels, (256, 1)).T,
                       np.tile(levels, (256, 1)).T])  # every (colour, alpha) pair for red and for blue
    cases.append(("alpha_sweep.png", _save(Image.fromarray(sweep, "RGBA"), "PNG")))
    cases.append(("interlaced.png", raw_png(rgb, 2, interlace=True)))
    wide = pattern(13, 11, 4, 6).astype(np.uint16) * 257 + np.arange(13, dtype=np.uint16)[None, :, None]
    cases.append(("rgb16.png", raw_png(wide[..., :3], 2)))
    cases.append(("rgba16_interlaced.png", raw_png(wide, 6, interlace=True)))
    cases.append(("gray_alpha16.png", raw_png(wide[..., :2], 4)))
    cases.append(("gray.png", _save(Image.fromarray(gray, "L"), "PNG")))
    cases.append(("gray_alpha.png", _save(Image.fromarray(np.dstack([gray, gray[::-1]]), "LA"), "PNG")))
    cases.append(("bilevel.png", _save(Image.fromarray(gray > 127), "PNG")))
    cases.append(("gray2bit.png", gray_2bit_png(gray)))
    cases.append(("gray4bit.png", _save(Image.fromarray(gray // 17 * 17, "L").convert("P"), "PNG", bits=4)))
    pal = Image.fromarray(rgb, "RGB").quantize(colors=50, dither=Image.Dither.NONE)
    cases.append(("palette.png", _save(pal, "PNG")))
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    cases.append(("palette_key.png", _save(pal_t, "PNG", transparency=3)))
    alphas = bytes((i * 37) % 256 for i in range(50))
    cases.append(("palette_alpha.png", _save(pal, "PNG", transparency=alphas)))
    cases.append(("gray16.png", _save(Image.fromarray((gray.astype(np.uint16) * 3).astype(np.uint16), "I;16"), "PNG")))
    cases.append(("rgb_key.png", _save(Image.fromarray(rgb, "RGB"), "PNG", transparency=tuple(int(v) for v in rgb[0, 0]))))
    cases.append(("gray_key.png", _save(Image.fromarray(gray, "L"), "PNG", transparency=int(gray[0, 0]))))
    cases.append(("rgb.jpg", _save(Image.fromarray(rgb, "RGB"), "JPEG", quality=85)))
    cases.append(("rgb444.jpg", _save(Image.fromarray(rgb, "RGB"), "JPEG", quality=90, subsampling=0)))
    cases.append(("rgb422.jpg", _save(Image.fromarray(rgb, "RGB"), "JPEG", quality=75, subsampling=1)))
    cases.append(("progressive.jpg", _save(Image.fromarray(rgb, "RGB"), "JPEG", quality=80, progressive=True)))
    cases.append(("gray.jpg", _save(Image.fromarray(gray, "L"), "JPEG", quality=80)))
    cmyk = Image.fromarray(pattern(37, 23, 4, 5), "CMYK")
    cases.append(("cmyk.jpg", _save(cmyk, "JPEG", quality=90)))
    cases.append(("palette.gif", _save(pal, "GIF")))
    cases.append(("transparent.gif", _save(pal, "GIF", transparency=3)))
    cases.append(("gray.gif", _save(Image.fromarray(gray, "L"), "GIF")))
    cases.append(("offset_frame.gif", gif_first_frame_offset()))
    frames = [Image.fromarray(pattern(21, 13, 3, 50 + i), "RGB") for i in range(3)]
    cases.append(("animated.gif", _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40)))
    cases.append(("animated.webp", _save(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)))
    cases.append(("lossless.webp", _save(Image.fromarray(rgb, "RGB"), "WEBP", lossless=True)))
    cases.append(("lossless_alpha.webp", _save(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True)))
    cases.append(("lossy.webp", _save(Image.fromarray(rgb, "RGB"), "WEBP", quality=80)))
    cases.append(("lossy_alpha.webp", _save(Image.fromarray(rgba, "RGBA"), "WEBP", quality=80)))
    return cases


def bad_cases(good):
    """(name, bytes, mime or None, expected message fragment) that must be rejected with a clear error."""
    png = dict(good)["rgb.png"]
    jpg = dict(good)["rgb.jpg"]
    gif = dict(good)["palette.gif"]
    webp = dict(good)["lossy.webp"]
    bomb = png_with_header(100000, 100000, idat=zlib.compress(b"\0" * 1000))
    return [
        ("empty", b"", None, "empty"),
        ("text", b"hello, this is not an image", None, "not a PNG, JPEG, WebP or GIF"),
        ("png_bomb", bomb, None, "pixels"),
        ("png_pixel_bomb", png_with_header(16000, 16000, idat=zlib.compress(b"\0" * 1000)), None, "pixels; at most"),
        ("png_zero_width", png_with_header(0, 10, idat=zlib.compress(b"\0" * 10)), None, "PNG"),
        ("png_truncated", png[: len(png) // 2], None, "PNG"),
        ("png_bad_crc", png[:40] + bytes([png[40] ^ 0xFF]) + png[41:], None, "PNG"),
        ("jpeg_truncated", jpg[: len(jpg) // 2], None, "JPEG"),
        ("jpeg_header_only", jpg[:20], None, "JPEG"),
        ("gif_truncated", gif[: len(gif) // 2], None, "GIF"),
        ("gif_zero_size", gif_zero_size(gif), None, "GIF"),
        ("webp_truncated", webp[: len(webp) // 2], None, "WebP"),
        ("png_declared_jpeg", png, "image/jpeg", "declared"),
        ("png_declared_text", png, "text/plain", "declared"),
    ]
