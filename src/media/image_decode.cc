#include "media/image_decode.h"

#include <cstring>
#include <fmt/format.h>

#include "media/image_codecs.h"
#include "util/error.h"

namespace qs::media {
namespace {

bool starts_with(std::span<const uint8_t> bytes, size_t offset, std::string_view magic) {
  return bytes.size() >= offset + magic.size() && std::memcmp(bytes.data() + offset, magic.data(), magic.size()) == 0;
}

std::string_view format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::png: return "PNG";
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::webp: return "WebP";
    case ImageFormat::gif: return "GIF";
    case ImageFormat::unknown: break;
  }
  return "unknown";
}

ImageFormat format_of_mime(std::string_view mime) {
  if (mime == "image/png") return ImageFormat::png;
  if (mime == "image/jpeg" || mime == "image/jpg") return ImageFormat::jpeg;
  if (mime == "image/webp") return ImageFormat::webp;
  if (mime == "image/gif") return ImageFormat::gif;
  return ImageFormat::unknown;
}

// transformers' convert_to_rgb: an image with alpha is alpha_composite'd over opaque white (Pillow's integer
// AlphaComposite.c, destination alpha 255) and its alpha dropped; one without keeps its colours.
RgbImage composite_onto_white(DecodedImage image) {
  if (!image.has_alpha) return {image.width, image.height, std::move(image.pixels)};
  RgbImage out{image.width, image.height, std::vector<uint8_t>(static_cast<size_t>(image.width) * image.height * 3)};
  const size_t pixels = static_cast<size_t>(image.width) * image.height;
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* src = &image.pixels[i * 4];
    uint8_t* dst = &out.rgb[i * 3];
    const uint32_t alpha = src[3];
    // Pillow's formula with 7 extra bits of precision and its rounded division by 255, ((x >> 8) + x) >> 8. Over
    // opaque white its output alpha is 255 * 255, so its coefficients, src.a * 255 * 255 * 2^7 / (255 * 255) and
    // 255 * 2^7 minus that, are exactly alpha << 7 and (255 - alpha) << 7; alpha 0 gives white, as Pillow's copy.
    constexpr uint32_t kBits = 7;
    for (int c = 0; c < 3; ++c) {
      const uint32_t blended = ((src[c] * alpha + 255 * (255 - alpha)) << kBits) + (0x80u << kBits);
      dst[c] = static_cast<uint8_t>((((blended >> 8) + blended) >> 8) >> kBits);
    }
  }
  return out;
}

}  // namespace

ImageFormat sniff_image_format(std::span<const uint8_t> bytes) {
  if (starts_with(bytes, 0, "\x89PNG\r\n\x1a\n")) return ImageFormat::png;
  if (starts_with(bytes, 0, "\xff\xd8\xff")) return ImageFormat::jpeg;
  if (starts_with(bytes, 0, "RIFF") && starts_with(bytes, 8, "WEBP")) return ImageFormat::webp;
  if (starts_with(bytes, 0, "GIF87a") || starts_with(bytes, 0, "GIF89a")) return ImageFormat::gif;
  return ImageFormat::unknown;
}

void check_dimensions(int64_t width, int64_t height, const ImageLimits& limits, std::string_view what,
                      std::string_view format) {
  if (width <= 0 || height <= 0) {
    throw Error(fmt::format("{}: the {} image is {}x{}; expected a non-empty image", what, format, width, height));
  }
  if (width > limits.max_side || height > limits.max_side) {
    throw Error(fmt::format("{}: the {} image is {}x{}; at most {} pixels a side are accepted", what, format, width,
                            height, limits.max_side));
  }
  if (width * height > limits.max_pixels) {
    throw Error(fmt::format("{}: the {} image is {}x{} = {} pixels; at most {} are accepted", what, format, width,
                            height, width * height, limits.max_pixels));
  }
}

RgbImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what,
                      std::string_view declared_mime) {
  if (bytes.empty()) throw Error(fmt::format("{}: the image is empty (0 bytes)", what));
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    throw Error(fmt::format("{}: the image is {} bytes; at most {} are accepted", what, bytes.size(),
                            limits.max_bytes));
  }
  const ImageFormat format = sniff_image_format(bytes);
  if (format == ImageFormat::unknown) {
    throw Error(fmt::format("{}: not a PNG, JPEG, WebP or GIF image (unrecognised leading bytes)", what));
  }
  if (!declared_mime.empty() && format_of_mime(declared_mime) != format) {
    throw Error(fmt::format("{}: declared as \"{}\" but the bytes are a {} image", what, declared_mime,
                            format_name(format)));
  }
  switch (format) {
    case ImageFormat::png: return composite_onto_white(decode_png(bytes, limits, what));
    case ImageFormat::jpeg: return composite_onto_white(decode_jpeg(bytes, limits, what));
    case ImageFormat::webp: return composite_onto_white(decode_webp(bytes, limits, what));
    case ImageFormat::gif: return composite_onto_white(decode_gif(bytes, limits, what));
    case ImageFormat::unknown: break;
  }
  throw Error(fmt::format("{}: unsupported image format", what));
}

}  // namespace qs::media
