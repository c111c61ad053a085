#include "media/image_resize.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace qs::media {
namespace {

// Pillow's fixed point: 22 fractional bits leave 8 bits for the value and 2 for filter overshoot in an int32.
constexpr int kPillowPrecisionBits = 32 - 8 - 2;
constexpr double kBicubicSupport = 2.0;

// Keys' cubic convolution with a = -0.5, in double as Pillow evaluates it.
double pillow_bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// The same kernel as torch evaluates it (UpSample.h's cubic_convolution1 / cubic_convolution2 with A = -0.5): the
// outer branch's products in another order, so some weights differ from Pillow's in the last bits.
double torch_bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// For each output position: the first input index, how many inputs it reads, and their fixed-point weights
// (`taps` per output, zero past `count`) with `precision` fractional bits.
struct Coefficients {
  int taps = 0, precision = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

// The antialiased box of both libraries for [0, in_size): the filter is widened by the scale when shrinking, each
// output's weights are normalised to sum to 1 in double. Returns them unrounded, [out_size, taps].
std::vector<double> float_weights(int in_size, int out_size, double (*kernel)(double), Coefficients& c) {
  // Pillow computes the box width in float (exact for any size below 2^24), torch in double: the same value.
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kBicubicSupport * filterscale;
  const double inv_filterscale = 1.0 / filterscale;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  std::vector<double> w(static_cast<size_t>(out_size) * c.taps, 0.0);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    // (int) truncates toward zero, as in both, before the clamp; torch also caps the count at the taps.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int count = std::clamp(std::min(static_cast<int>(center + support + 0.5), in_size) - xmin, 0, c.taps);
    double* k = &w[static_cast<size_t>(xx) * c.taps];
    double sum = 0.0;
    for (int x = 0; x < count; ++x) {
      k[x] = kernel((x + xmin - center + 0.5) * inv_filterscale);
      sum += k[x];
    }
    if (sum != 0.0)
      for (int x = 0; x < count; ++x) k[x] /= sum;
    c.first[xx] = xmin;
    c.count[xx] = count;
  }
  return w;
}

// Rounded half away from zero to `precision` fractional bits, as both libraries round.
void round_weights(const std::vector<double>& w, Coefficients& c) {
  c.weights.resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const double fixed = w[i] * (1 << c.precision);
    c.weights[i] = static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
  }
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc: 22 fractional bits.
Coefficients pillow_coefficients(int in_size, int out_size) {
  Coefficients c;
  const std::vector<double> w = float_weights(in_size, out_size, pillow_bicubic, c);
  c.precision = kPillowPrecisionBits;
  round_weights(w, c);
  return c;
}

// torch's _compute_index_ranges_int16_weights (UpSampleKernel.cpp): int16 weights, with as many fractional bits
// (at most 22) as keep the axis's largest weight below 2^15.
Coefficients torch_coefficients(int in_size, int out_size) {
  Coefficients c;
  const std::vector<double> w = float_weights(in_size, out_size, torch_bicubic, c);
  const double largest = w.empty() ? 0.0 : *std::max_element(w.begin(), w.end());
  for (c.precision = 0; c.precision < 22; ++c.precision)
    if (static_cast<int>(0.5 + largest * (1 << (c.precision + 1))) >= (1 << 15)) break;
  round_weights(w, c);
  return c;
}

uint8_t clip8(int32_t sum, int precision) { return static_cast<uint8_t>(std::clamp(sum >> precision, 0, 255)); }

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
        int32_t sum = 1 << (c.precision - 1);
        for (int x = 0; x < c.count[xx]; ++x) sum += base[x * ch + b] * k[x];
        dst[xx * ch + b] = clip8(sum, c.precision);
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
      int32_t sum = 1 << (c.precision - 1);
      for (int y = 0; y < c.count[yy]; ++y) sum += in.row(first + y)[i] * k[y];
      dst[i] = clip8(sum, c.precision);
    }
  }
  return out;
}

// The horizontal pass on only the rows the vertical one reads, then the vertical pass; a side that keeps its size
// is not resampled.
std::vector<uint8_t> separable(const PlaneView& in, const Coefficients& horizontal, const Coefficients& vertical,
                               int out_width, int out_height) {
  if (out_width == in.width) return std::move(resample_vertical(in, vertical, 0).pixels);
  const int row0 = vertical.first.front();
  const int rows = vertical.first.back() + vertical.count.back() - row0;
  Plane wide = resample_horizontal(in, horizontal, row0, rows);
  if (out_height == in.height) return std::move(wide.pixels);
  return std::move(resample_vertical(wide.view(), vertical, row0).pixels);
}

void check_sizes(std::span<const uint8_t> pixels, int width, int height, int channels, int out_width,
                 int out_height, const char* what) {
  if (width <= 0 || height <= 0 || out_width <= 0 || out_height <= 0 || channels < 1 || channels > 4 ||
      pixels.size() != static_cast<size_t>(width) * height * channels) {
    throw Error(std::string(what) + ": bad sizes");
  }
}

}  // namespace

std::vector<uint8_t> resize_bicubic(std::span<const uint8_t> pixels, int width, int height, int channels,
                                    int out_width, int out_height) {
  check_sizes(pixels, width, height, channels, out_width, out_height, "resize_bicubic");
  if (out_width == width && out_height == height) return {pixels.begin(), pixels.end()};
  const PlaneView in{pixels.data(), width, height, channels};
  const Coefficients horizontal = pillow_coefficients(width, out_width);
  const Coefficients vertical = pillow_coefficients(height, out_height);
  // Image.resize shrinks an image over 100 times taller than wide in two calls, vertical pass first (each rounds
  // to 8 bits); otherwise ImagingResample runs the horizontal pass first.
  if (height > static_cast<int64_t>(width) * 100 && out_height < height) {
    Plane tall = resample_vertical(in, vertical, 0);
    if (out_width == width) return std::move(tall.pixels);
    return std::move(resample_horizontal(tall.view(), horizontal, 0, out_height).pixels);
  }
  return separable(in, horizontal, vertical, out_width, out_height);
}

std::vector<uint8_t> resize_bicubic_torch(std::span<const uint8_t> pixels, int width, int height, int channels,
                                          int out_width, int out_height) {
  check_sizes(pixels, width, height, channels, out_width, out_height, "resize_bicubic_torch");
  if (out_width == width && out_height == height) return {pixels.begin(), pixels.end()};
  const PlaneView in{pixels.data(), width, height, channels};
  return separable(in, torch_coefficients(width, out_width), torch_coefficients(height, out_height), out_width,
                   out_height);
}

}  // namespace qs::media
