// PNG through libpng, reproducing Pillow 12.3's PngImagePlugin modes: 1/2/4-bit gray scaled to 8 bits, 16-bit gray
// as I;16 (Image.convert("RGB") saturates it at 255), other 16-bit samples by their high byte, palette entries past
// PLTE black, and tRNS as Pillow keeps it (a palette's alpha table; a gray or RGB key compared with the samples as
// Pillow unpacks them). Gamma, ICC and colour chunks are ignored, as Pillow does.
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>

#include "media/image_codecs.h"
#include "util/error.h"

namespace qs::media {
namespace {

// libpng's state for one image; its error handler longjmps back into read_header or read_pixels, whose frames hold
// only trivially destructible locals.
struct PngReader {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
  char error[200] = "libpng failed";
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_colorp palette = nullptr;
  int palette_size = 0;
  png_bytep trns_alpha = nullptr;
  int trns_count = 0;
  png_color_16p trns_key = nullptr;

  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

void on_error(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->error, sizeof reader->error, "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

void read_bytes(png_structp png, png_bytep out, png_size_t count) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (count > reader->bytes.size() - reader->offset) png_error(png, "truncated file");
  std::memcpy(out, reader->bytes.data() + reader->offset, count);
  reader->offset += count;
}

bool is_gray16(const PngReader& r) { return r.color_type == PNG_COLOR_TYPE_GRAY && r.bit_depth == 16; }

bool read_header(PngReader& r) {
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, on_error, on_warning);
  if (!r.png) return false;
  r.info = png_create_info_struct(r.png);
  if (!r.info) return false;
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_set_read_fn(r.png, &r, read_bytes);
  // Dimensions are checked against ImageLimits right after the header, with a clearer message than libpng's.
  png_set_user_limits(r.png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  png_set_chunk_malloc_max(r.png, 8u << 20);  // text and ICC chunks cannot inflate past 8 MiB
  png_read_info(r.png, r.info);
  png_get_IHDR(r.png, r.info, &r.width, &r.height, &r.bit_depth, &r.color_type, &r.interlace, nullptr, nullptr);
  png_get_PLTE(r.png, r.info, &r.palette, &r.palette_size);
  png_get_tRNS(r.png, r.info, &r.trns_alpha, &r.trns_count, &r.trns_key);
  return true;
}

// Samples after png_set_packing (a byte per sub-byte sample, unscaled), png_set_strip_16 (the high byte) except for
// 16-bit gray (big-endian pairs), and interlace handling.
bool read_pixels(PngReader& r, png_bytep* rows, size_t row_bytes) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  if (r.bit_depth < 8) png_set_packing(r.png);
  if (r.bit_depth == 16 && !is_gray16(r)) png_set_strip_16(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_rowbytes(r.png, r.info) != row_bytes) png_error(r.png, "unexpected row size");
  png_read_image(r.png, rows);
  return true;
}

int channels_of(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA: return 4;
    default: return 1;  // gray, palette
  }
}

// Pillow's L;1 (mode "1"), L;2 and L;4 unpackers stretch the levels to 0..255.
int gray_scale(int bit_depth) { return bit_depth == 1 ? 255 : bit_depth == 2 ? 85 : bit_depth == 4 ? 17 : 1; }

// Whether Pillow's image has an alpha band (LA, RGBA) or a transparency key (tRNS).
bool png_has_alpha(const PngReader& r) {
  return (r.color_type & PNG_COLOR_MASK_ALPHA) || r.trns_key != nullptr || (r.trns_alpha && r.trns_count > 0);
}

// The samples as out.channels() bytes a pixel (RGB, or RGBA when png_has_alpha).
void convert_samples(const PngReader& r, std::vector<uint8_t> samples, DecodedImage& out) {
  const int ch = out.channels();
  if (r.color_type == PNG_COLOR_TYPE_RGB_ALPHA || (r.color_type == PNG_COLOR_TYPE_RGB && ch == 3)) {
    out.pixels = std::move(samples);  // already RGBA or RGB
    return;
  }
  const size_t pixels = static_cast<size_t>(r.width) * r.height;
  out.pixels.resize(pixels * ch);
  uint8_t* dst = out.pixels.data();
  const uint8_t* src = samples.data();
  switch (r.color_type) {
    case PNG_COLOR_TYPE_GRAY: {
      // Pillow keeps the tRNS gray value as read and compares it with the unpacked pixel (L or I;16).
      const int key = r.trns_key ? r.trns_key->gray : -1;
      const int scale = gray_scale(r.bit_depth);
      for (size_t i = 0; i < pixels; ++i, dst += ch) {
        const int value = is_gray16(r) ? (src[2 * i] << 8 | src[2 * i + 1]) : src[i] * scale;
        dst[0] = dst[1] = dst[2] = static_cast<uint8_t>(std::min(value, 255));
        if (ch == 4) dst[3] = value == key ? 0 : 255;
      }
      break;
    }
    case PNG_COLOR_TYPE_RGB: {  // with a tRNS colour key
      for (size_t i = 0; i < pixels; ++i, dst += 4, src += 3) {
        std::memcpy(dst, src, 3);
        const bool keyed = src[0] == r.trns_key->red && src[1] == r.trns_key->green && src[2] == r.trns_key->blue;
        dst[3] = keyed ? 0 : 255;
      }
      break;
    }
    case PNG_COLOR_TYPE_PALETTE: {
      uint8_t table[256][4] = {};  // entries past PLTE: black, as Pillow's palette conversion gives
      for (int i = 0; i < 256; ++i) table[i][3] = 255;
      for (int i = 0; i < r.palette_size && i < 256; ++i) {
        table[i][0] = r.palette[i].red, table[i][1] = r.palette[i].green, table[i][2] = r.palette[i].blue;
      }
      for (int i = 0; i < r.trns_count && i < 256; ++i) table[i][3] = r.trns_alpha[i];
      for (size_t i = 0; i < pixels; ++i, dst += ch) std::memcpy(dst, table[src[i]], ch);
      break;
    }
    default:  // gray + alpha
      for (size_t i = 0; i < pixels; ++i, dst += 4, src += 2) {
        dst[0] = dst[1] = dst[2] = src[0];
        dst[3] = src[1];
      }
  }
}

}  // namespace

DecodedImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what) {
  PngReader r;
  r.bytes = bytes;
  if (!read_header(r)) {
    throw Error(fmt::format("{}: corrupt or truncated PNG: {}", what, r.error));
  }
  check_dimensions(r.width, r.height, limits, what, "PNG");
  const size_t row_bytes = static_cast<size_t>(r.width) * channels_of(r.color_type) * (is_gray16(r) ? 2 : 1);
  std::vector<uint8_t> samples(row_bytes * r.height);
  std::vector<png_bytep> rows(r.height);
  for (png_uint_32 y = 0; y < r.height; ++y) rows[y] = samples.data() + y * row_bytes;
  if (!read_pixels(r, rows.data(), row_bytes)) {
    throw Error(fmt::format("{}: corrupt or truncated PNG: {}", what, r.error));
  }
  DecodedImage out{static_cast<int>(r.width), static_cast<int>(r.height), png_has_alpha(r)};
  convert_samples(r, std::move(samples), out);
  return out;
}

}  // namespace qs::media
