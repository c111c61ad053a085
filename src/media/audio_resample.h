#pragma once
// Sample-rate conversion with libsoxr, the library behind the `soxr` package that librosa and Hugging Face's
// `load_audio` call with quality 'soxr_hq'.
#include <span>
#include <string_view>
#include <vector>

namespace qs::media {

// `mono` at `from_rate` Hz resampled to `to_rate` Hz at soxr's HQ recipe (float32 in and out, the whole signal
// flushed), trimmed or zero-padded to ceil(size * to_rate / from_rate) samples. Returns `mono` unchanged when the
// rates are equal.
std::vector<float> resample_hq(std::vector<float> mono, int from_rate, int to_rate, std::string_view what);

}  // namespace qs::media
