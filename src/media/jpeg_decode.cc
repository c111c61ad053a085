// JPEG through libjpeg-turbo with the settings Pillow 12.3's decoder keeps (libjpeg's defaults: islow IDCT, fancy
// upsampling): 1 component -> L, 3 -> RGB (libjpeg converts YCbCr), 4 -> CMYK read with Adobe's inverted polarity
// ("CMYK;I") and converted as Image.convert("RGB") does.
#include <cstdio>
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#include <jerror.h>

#include <algorithm>
#include <csetjmp>
#include <fmt/format.h>

#include "media/image_codecs.h"
#include "util/error.h"

namespace qs::media {
namespace {

// A progressive JPEG may hold thousands of tiny scans, each a full pass over the coefficients; real encoders write
// about ten.
constexpr int kMaxScans = 1000;

struct JpegReader {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr errors{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump{};
  char error[JMSG_LENGTH_MAX] = "libjpeg failed";
  bool created = false;
  bool truncated = false;

  ~JpegReader() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

void on_error(j_common_ptr cinfo) {
  auto* reader = static_cast<JpegReader*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, reader->error);
  std::longjmp(reader->jump, 1);
}

// Warnings are not printed; running out of data is an error, as Pillow reports a truncated image.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) static_cast<JpegReader*>(cinfo->client_data)->truncated = true;
}

void on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxScans) {
    auto* reader = static_cast<JpegReader*>(cinfo->client_data);
    std::snprintf(reader->error, sizeof reader->error, "more than %d scans", kMaxScans);
    std::longjmp(reader->jump, 1);
  }
}

// libjpeg leaves these frames by longjmp on any error: only trivially destructible locals here.
bool read_header(JpegReader& r, std::span<const uint8_t> bytes) {
  r.cinfo.err = jpeg_std_error(&r.errors);
  r.errors.error_exit = on_error;
  r.errors.emit_message = on_message;
  r.cinfo.client_data = &r;
  if (setjmp(r.jump)) return false;
  jpeg_create_decompress(&r.cinfo);
  r.created = true;
  r.progress.progress_monitor = on_progress;
  r.cinfo.progress = &r.progress;
  jpeg_mem_src(&r.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&r.cinfo, TRUE);
  return true;
}

bool read_pixels(JpegReader& r, uint8_t* out, size_t row_bytes) {
  if (setjmp(r.jump)) return false;
  const int components = r.cinfo.num_components;
  r.cinfo.out_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_start_decompress(&r.cinfo);
  if (static_cast<size_t>(r.cinfo.output_width) * r.cinfo.output_components != row_bytes) {
    std::snprintf(r.error, sizeof r.error, "unexpected output layout");
    return false;
  }
  while (r.cinfo.output_scanline < r.cinfo.output_height) {
    JSAMPROW row = out + r.cinfo.output_scanline * row_bytes;
    jpeg_read_scanlines(&r.cinfo, &row, 1);
  }
  jpeg_finish_decompress(&r.cinfo);
  return true;
}

// Pillow's cmyk2rgb on the inverted samples: nk - nk * c / 255 with its rounded division.
uint8_t cmyk_channel(int c, int nk) {
  const int product = c * nk + 128;
  return static_cast<uint8_t>(std::clamp(nk - (((product >> 8) + product) >> 8), 0, 255));
}

}  // namespace

DecodedImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what) {
  JpegReader r;
  if (!read_header(r, bytes)) throw Error(fmt::format("{}: corrupt or truncated JPEG: {}", what, r.error));
  check_dimensions(r.cinfo.image_width, r.cinfo.image_height, limits, what, "JPEG");
  const int components = r.cinfo.num_components;
  if (components != 1 && components != 3 && components != 4) {
    throw Error(fmt::format("{}: JPEG with {} colour components; expected 1, 3 or 4", what, components));
  }
  const int width = static_cast<int>(r.cinfo.image_width), height = static_cast<int>(r.cinfo.image_height);
  const size_t row_bytes = static_cast<size_t>(width) * components;
  std::vector<uint8_t> samples(row_bytes * height);
  if (!read_pixels(r, samples.data(), row_bytes) || r.truncated) {
    if (r.truncated) std::snprintf(r.error, sizeof r.error, "premature end of data");
    throw Error(fmt::format("{}: corrupt or truncated JPEG: {}", what, r.error));
  }
  DecodedImage out{width, height, false};
  if (components == 3) {
    out.pixels = std::move(samples);
    return out;
  }
  const size_t pixels = static_cast<size_t>(width) * height;
  out.pixels.resize(pixels * 3);
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* s = &samples[i * components];
    uint8_t* d = &out.pixels[i * 3];
    if (components == 1) {
      d[0] = d[1] = d[2] = s[0];
    } else {
      const int nk = s[3];  // 255 - (255 - K): Pillow stores the inverted K and takes 255 minus it
      for (int c = 0; c < 3; ++c) d[c] = cmyk_channel(255 - s[c], nk);
    }
  }
  return out;
}

}  // namespace qs::media
