#pragma once
// Untrusted image bytes -> 8-bit RGB, as the Hugging Face Gemma 4 processor sees them: decoded as Pillow 12.3 decodes
// them (PNG, JPEG, WebP, GIF first frame; Debian's libpng, libjpeg-turbo, libwebp and giflib underneath) and
// converted to RGB as transformers' `convert_to_rgb` does (anything with an alpha band or a transparency key is
// composited onto opaque white with Pillow's integer alpha_composite; palette, gray, 16-bit and CMYK as
// Image.convert("RGB")). Every failure is a qs::Error naming `what` (e.g. "messages[0].content[1]").
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace qs::media {

// Checked on the byte count and on the dimensions in the header, before any pixel is decoded (decompression bombs).
struct ImageLimits {
  int64_t max_pixels = 40'000'000;  // width x height (of a GIF's whole canvas)
  int64_t max_bytes = 32ll << 20;   // the encoded image
  int max_side = 16384;             // width and height each
};

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel
};

enum class ImageFormat { unknown, png, jpeg, webp, gif };

// From the leading magic bytes only (never from a declared type).
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

// `declared_mime` (e.g. a data URL's "image/png"), when not empty, must name the format the bytes are.
RgbImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what,
                      std::string_view declared_mime = {});

}  // namespace qs::media
