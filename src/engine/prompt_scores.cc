#include "engine/prompt_scores.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace qs {
namespace {

// log(sum(exp(logits))), in double so that a 262k-token vocabulary loses nothing to rounding.
double log_sum_exp(std::span<const float> logits) {
  float max = -std::numeric_limits<float>::infinity();
  for (float l : logits) max = std::max(max, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return max + std::log(sum);
}

bool ranks_before(const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
  return a.second > b.second || (a.second == b.second && a.first < b.first);
}

// The n largest logits (id, logit), best first: one pass, n is at most kMaxTopLogprobs.
std::vector<std::pair<int32_t, float>> top_logits(std::span<const float> logits, int32_t n) {
  std::vector<std::pair<int32_t, float>> best;
  if (n <= 0) return best;
  best.reserve(n + 1);
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
    const std::pair<int32_t, float> c{id, logits[id]};
    if (static_cast<int32_t>(best.size()) == n && !ranks_before(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, ranks_before), c);
    if (static_cast<int32_t>(best.size()) > n) best.pop_back();
  }
  return best;
}

}  // namespace

SampledToken score_token(std::span<const float> logits, int32_t id, int32_t alternatives) {
  const double log_norm = log_sum_exp(logits);
  SampledToken t;
  t.id = id;
  t.logprob = static_cast<float>(logits[id] - log_norm);
  for (auto [alt, logit] : top_logits(logits, alternatives))
    t.top_logprobs.emplace_back(alt, static_cast<float>(logit - log_norm));
  return t;
}

}  // namespace qs
