#pragma once
// The pieces of the log-mel front end that depend only on the options: transformers' `mel_filter_bank` (HTK mel
// scale, no normalisation, triangles in Hz, float64) and the periodic Hann window of `window_function`.
#include <vector>

namespace qs::media {

// [num_frequency_bins x num_mel_filters], row-major, float64 as transformers builds it.
std::vector<double> htk_mel_filter_bank(int num_frequency_bins, int num_mel_filters, double min_frequency,
                                        double max_frequency, int sampling_rate);

// Periodic Hann window of `length` samples: numpy's hanning(length + 1) without its last sample, in float64.
std::vector<double> periodic_hann_window(int length);

}  // namespace qs::media
