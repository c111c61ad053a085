#include "media/mel_filter_bank.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace qs::media {
namespace {

double hertz_to_htk_mel(double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); }
double htk_mel_to_hertz(double mel) { return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0); }

// numpy.linspace(start, stop, num): start + i * step, the last point exactly `stop`.
std::vector<double> linspace(double start, double stop, int num) {
  std::vector<double> v(num);
  const double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; ++i) v[i] = i * step + start;
  v[num - 1] = stop;
  return v;
}

}  // namespace

std::vector<double> htk_mel_filter_bank(int num_frequency_bins, int num_mel_filters, double min_frequency,
                                        double max_frequency, int sampling_rate) {
  std::vector<double> centers = linspace(hertz_to_htk_mel(min_frequency), hertz_to_htk_mel(max_frequency),
                                         num_mel_filters + 2);
  for (double& c : centers) c = htk_mel_to_hertz(c);
  const std::vector<double> bin_hz = linspace(0.0, sampling_rate / 2, num_frequency_bins);  // integer Nyquist, as HF
  std::vector<double> bank(static_cast<size_t>(num_frequency_bins) * num_mel_filters);
  for (int f = 0; f < num_frequency_bins; ++f) {
    for (int m = 0; m < num_mel_filters; ++m) {
      const double down = -(centers[m] - bin_hz[f]) / (centers[m + 1] - centers[m]);
      const double up = (centers[m + 2] - bin_hz[f]) / (centers[m + 2] - centers[m + 1]);
      bank[static_cast<size_t>(f) * num_mel_filters + m] = std::max(0.0, std::min(down, up));
    }
  }
  return bank;
}

std::vector<double> periodic_hann_window(int length) {
  const int m = length + 1;  // numpy.hanning(m): 0.5 + 0.5 cos(pi n / (m - 1)), n = 1 - m, 3 - m, ..., m - 1
  std::vector<double> w(length);
  for (int k = 0; k < length; ++k) w[k] = 0.5 + 0.5 * std::cos(std::numbers::pi * (1 - m + 2 * k) / (m - 1));
  return w;
}

}  // namespace qs::media
