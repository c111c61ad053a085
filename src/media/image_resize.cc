#include "media/image_resize.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace qs::media {
namespace {

// Pillow's fixed point: 22 fractional bits leave 8 bits for the value and 2 for filter overshoot in an int32.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kBicubicSupport = 2.0;

// Keys' cubic convolution with a = -0.5, in double as Pillow evaluates it.
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output position: the first input index, how many inputs it reads, and their fixed-point weights
// (`taps` per output, zero past `count`).
struct Coefficients {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the box [0, in_size): the filter is widened by the scale
// when shrinking (antialiasing), each output's weights are normalised to sum to 1 in double, then rounded half away
// from zero to 22 fractional bits.
Coefficients precompute(int in_size, int out_size) {
  // Pillow computes the box width in float (exact for any size below 2^24) and the rest in double.
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kBicubicSupport * filterscale;
  const double inv_filterscale = 1.0 / filterscale;
  Coefficients c;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.taps, 0);
  std::vector<double> w(c.taps);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    // (int) truncates toward zero, as in Pillow, before the clamp.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double sum = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = bicubic((x + xmin - center + 0.5) * inv_filterscale);
      sum += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double k = sum != 0.0 ? w[x] / sum : w[x];
      const double fixed = k * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.taps + x] = static_cast<int32_t>(k < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t sum) { return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255)); }

// Interleaved 8-bit pixels: the caller's (a view) or a pass's output (owned).
struct PlaneView {
  const uint8_t* data = nullptr;
  int width = 0, height = 0, channels = 0;
  const uint8_t* row(int y) const { return data + static_cast<size_t>(y) * width * channels; }
};

struct Plane {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
  PlaneView view() const { return {pixels.data(), width, height, channels}; }
};

// Rows [row0, row0 + rows) of `in`, each resampled horizontally to c.first.size() columns.
Plane resample_horizontal(const PlaneView& in, const Coefficients& c, int row0, int rows) {
  const int out_w = static_cast<int>(c.first.size()), ch = in.channels;
  Plane out{out_w, rows, ch, std::vector<uint8_t>(static_cast<size_t>(out_w) * rows * ch)};
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = in.row(row0 + y);
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * out_w * ch;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &c.weights[static_cast<size_t>(xx) * c.taps];
      const uint8_t* base = src + static_cast<size_t>(c.first[xx]) * ch;
      for (int b = 0; b < ch; ++b) {
        int32_t sum = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < c.count[xx]; ++x) sum += base[x * ch + b] * k[x];
        dst[xx * ch + b] = clip8(sum);
      }
    }
  }
  return out;
}

// `in` resampled vertically to c.first.size() rows; c.first counts from `row0` of the original image.
Plane resample_vertical(const PlaneView& in, const Coefficients& c, int row0) {
  const int out_h = static_cast<int>(c.first.size()), ch = in.channels, row_bytes = in.width * ch;
  Plane out{in.width, out_h, ch, std::vector<uint8_t>(static_cast<size_t>(row_bytes) * out_h)};
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &c.weights[static_cast<size_t>(yy) * c.taps];
    const int first = c.first[yy] - row0;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(yy) * row_bytes;
    for (int i = 0; i < row_bytes; ++i) {
      int32_t sum = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < c.count[yy]; ++y) sum += in.row(first + y)[i] * k[y];
      dst[i] = clip8(sum);
    }
  }
  return out;
}

}  // namespace

std::vector<uint8_t> resize_bicubic(std::span<const uint8_t> pixels, int width, int height, int channels,
                                    int out_width, int out_height) {
  if (width <= 0 || height <= 0 || out_width <= 0 || out_height <= 0 || channels < 1 || channels > 4 ||
      pixels.size() != static_cast<size_t>(width) * height * channels) {
    throw Error("resize_bicubic: bad sizes");
  }
  if (out_width == width && out_height == height) return {pixels.begin(), pixels.end()};
  const PlaneView in{pixels.data(), width, height, channels};
  const Coefficients horizontal = precompute(width, out_width);
  const Coefficients vertical = precompute(height, out_height);
  // Image.resize shrinks an image over 100 times taller than wide in two calls, vertical pass first (each rounds
  // to 8 bits); otherwise ImagingResample runs the horizontal pass first, on only the rows the vertical one reads.
  if (height > static_cast<int64_t>(width) * 100 && out_height < height) {
    Plane tall = resample_vertical(in, vertical, 0);
    if (out_width == width) return std::move(tall.pixels);
    return std::move(resample_horizontal(tall.view(), horizontal, 0, out_height).pixels);
  }
  if (out_width == width) return std::move(resample_vertical(in, vertical, 0).pixels);
  const int row0 = vertical.first.front();
  const int rows = vertical.first.back() + vertical.count.back() - row0;
  Plane wide = resample_horizontal(in, horizontal, row0, rows);
  if (out_height == height) return std::move(wide.pixels);
  return std::move(resample_vertical(wide.view(), vertical, row0).pixels);
}

}  // namespace qs::media
