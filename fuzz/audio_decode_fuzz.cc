// libFuzzer target: arbitrary bytes as an uploaded audio file. decode_audio either returns mono 16 kHz samples
// within the limits, all finite, or throws qs::Error; and the log-mel features of what it returns are finite.
// Leaks, overflows and undefined behaviour in our code or in what libsndfile/libsoxr do with our buffers are the
// sanitizers' to find.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "media/audio_decode.h"
#include "media/audio_features.h"
#include "util/error.h"

namespace {

constexpr qs::media::AudioLimits kLimits{.max_bytes = 1 << 20, .max_seconds = 10.0};
constexpr size_t kFeatureSamples = 2 * qs::media::kAudioSampleRate;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<float> samples;
  try {
    samples = qs::media::decode_audio(std::span(data, size), "", kLimits, "fuzz input");
  } catch (const qs::Error&) {
    return 0;
  }
  if (samples.empty() || samples.size() > static_cast<size_t>(kLimits.max_seconds * qs::media::kAudioSampleRate) + 1)
    std::abort();
  for (float v : samples)
    if (!std::isfinite(v)) std::abort();
  const auto features = qs::media::extract_audio_features(
      std::span(samples.data(), std::min(samples.size(), kFeatureSamples)), qs::media::AudioFeatureOptions{});
  for (float v : features.features)
    if (!std::isfinite(v)) std::abort();
  return 0;
}
