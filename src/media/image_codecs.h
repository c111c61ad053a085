#pragma once
// The per-format decoders behind decode_image (image_decode.h), one file each. Each checks the header's dimensions
// against the limits before it decodes a pixel and returns the picture as Pillow would hold it, as RGB or RGBA.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "media/image_decode.h"

namespace qs::media {

struct DecodedImage {
  int width = 0, height = 0;
  // Pillow's image has an alpha band or a transparency key, so transformers composites it onto white.
  bool has_alpha = false;
  std::vector<uint8_t> pixels;  // row-major RGBA when has_alpha, else RGB

  int channels() const { return has_alpha ? 4 : 3; }
};

DecodedImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what);
DecodedImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what);
DecodedImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what);
DecodedImage decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what);

// Throws when width x height breaks the limits (or either is zero), naming `what` and the format.
void check_dimensions(int64_t width, int64_t height, const ImageLimits& limits, std::string_view what,
                      std::string_view format);

}  // namespace qs::media
