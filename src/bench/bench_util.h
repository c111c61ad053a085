#pragma once
// What the bench's runners share (bench.cc, speculative_bench.cc): timing, medians and deterministic prompts.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "formats/model_config.h"

namespace qs::bench_util {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Deterministic token ids spread over the vocabulary (and inside the per-layer-embedding table).
inline std::vector<int32_t> bench_tokens(const Gemma4TextConfig& c, int64_t n, int64_t salt) {
  const int64_t limit = c.has_ple() ? std::min(c.vocab_size, c.vocab_size_per_layer_input) : c.vocab_size;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(10 + (i * 7919 + salt * 104729) % (limit - 10));
  return ids;
}

}  // namespace qs::bench_util
