#include "engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include "util/error.h"

namespace qs {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Candidate {
  float logit;
  float weight;  // exp((logit - max) / temperature): unnormalised probability, in (0, 1]
  int32_t id;
};

// A strict total order: higher logit first, then lower id, so equal logits rank the same way on every run.
bool ranks_above(float logit_a, int32_t id_a, float logit_b, int32_t id_b) {
  return logit_a > logit_b || (logit_a == logit_b && id_a < id_b);
}
bool ranks_above(const Candidate& a, const Candidate& b) { return ranks_above(a.logit, a.id, b.logit, b.id); }

// Vocab-sized buffers, one set per thread: a request's Sampler lives as long as the request, and a few hundred
// queued requests must not each hold megabytes. `seen` and `counts` are all zero between calls.
struct Scratch {
  std::vector<float> logits;
  std::vector<Candidate> candidates;
  std::vector<uint8_t> seen;
  std::vector<uint32_t> counts;
};
Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// SplitMix64's finaliser. mix(seed + k * gamma) is SplitMix64's k-th output: a counter-based generator, so draw k
// of a seed depends on nothing but the seed and k.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// Unseeded requests still need different streams from each other: the clock and a process-wide counter.
uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{0};
  auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return mix64(now ^ mix64(counter.fetch_add(1) + kGoldenGamma));
}

void check_token_ids(std::span<const int32_t> ids, size_t vocab, std::string_view what) {
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= vocab)
      throw Error(fmt::format("{}: token id {} is outside the vocabulary of {} tokens", what, id, vocab));
}

// The largest logit, in one pass GCC vectorises: independent per-lane maxima carry no loop dependency. The model
// must give finite values (or -inf for a masked token): NaN or +inf would make every probability NaN, so they are
// reported rather than sampled from. x - x is NaN exactly for NaN and +-inf; as -inf is legal, a NaN probe is
// confirmed by a scalar scan, which also names the token. `what` says which logits, for that message.
float checked_max(std::span<const float> logits, std::string_view what) {
  constexpr size_t kLanes = 16;
  std::array<float, kLanes> lane_max, probe{};
  lane_max.fill(kNegInf);
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      float l = logits[i + j];
      lane_max[j] = l > lane_max[j] ? l : lane_max[j];
      probe[j] += l - l;
    }
  float max = kNegInf, probe_sum = 0;
  for (; i < logits.size(); ++i) {
    max = logits[i] > max ? logits[i] : max;
    probe_sum += logits[i] - logits[i];
  }
  for (size_t j = 0; j < kLanes; ++j) {
    max = lane_max[j] > max ? lane_max[j] : max;
    probe_sum += probe[j];
  }
  if (probe_sum != 0 || max == std::numeric_limits<float>::infinity())
    for (size_t t = 0; t < logits.size(); ++t)
      if (std::isnan(logits[t]) || logits[t] == std::numeric_limits<float>::infinity())
        throw Error(fmt::format("{}: token {} has logit {}; expected a finite value or -inf", what, t, logits[t]));
  return max;
}

// The largest of logits known to hold no NaN or +inf, in one vectorisable pass.
float plain_max(std::span<const float> logits) {
  constexpr size_t kLanes = 16;
  std::array<float, kLanes> lane_max;
  lane_max.fill(kNegInf);
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lane_max[j] = logits[i + j] > lane_max[j] ? logits[i + j] : lane_max[j];
  float max = kNegInf;
  for (; i < logits.size(); ++i) max = logits[i] > max ? logits[i] : max;
  for (float l : lane_max) max = l > max ? l : max;
  return max;
}

bool changes_logits(const SamplingParams& p, std::span<const uint64_t> allowed) {
  return !allowed.empty() || !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f;
}

// vLLM: once per distinct token in prompt or output, positive logits divided by the penalty, negative multiplied.
void apply_repetition_penalty(std::span<float> logits, float penalty, std::span<const int32_t> prompt,
                              std::span<const int32_t> output, std::vector<uint8_t>& seen) {
  if (penalty == 1.0f) return;
  seen.resize(logits.size());
  auto penalise = [&](int32_t id) {
    if (seen[id]) return;
    seen[id] = 1;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  };
  for (int32_t id : prompt) penalise(id);
  for (int32_t id : output) penalise(id);
  for (int32_t id : prompt) seen[id] = 0;
  for (int32_t id : output) seen[id] = 0;
}

// OpenAI: logit -= frequency * count + presence * (count > 0), counting output tokens only.
void apply_output_penalties(std::span<float> logits, float frequency, float presence, std::span<const int32_t> output,
                            std::vector<uint32_t>& counts) {
  if (frequency == 0.0f && presence == 0.0f) return;
  counts.resize(logits.size());
  for (int32_t id : output) ++counts[id];
  for (int32_t id : output) {
    if (counts[id] == 0) continue;  // already applied for this id
    logits[id] -= frequency * static_cast<float>(counts[id]) + presence;
    counts[id] = 0;
  }
}

// Tokens whose bit is clear in `allowed` get -inf; a whole word of allowed tokens costs one comparison.
void apply_allowed(std::span<float> logits, std::span<const uint64_t> allowed) {
  for (size_t w = 0; w < allowed.size() && w * 64 < logits.size(); ++w) {
    const uint64_t bits = allowed[w];
    if (bits == ~uint64_t{0}) continue;
    const size_t begin = w * 64, end = std::min(logits.size(), begin + 64);
    for (size_t i = begin; i < end; ++i) logits[i] = (bits >> (i - begin)) & 1 ? logits[i] : kNegInf;  // branchless
  }
  for (size_t i = allowed.size() * 64; i < logits.size(); ++i) logits[i] = kNegInf;
}

// The logits after logit_bias, the penalties and the allowed-token mask: `raw` itself when none apply, else a
// copy in scratch.
std::span<const float> adjusted_logits(std::span<const float> raw, const SamplingParams& p,
                                       std::span<const int32_t> prompt, std::span<const int32_t> output,
                                       std::span<const uint64_t> allowed, Scratch& scratch) {
  if (!changes_logits(p, allowed)) return raw;
  scratch.logits.assign(raw.begin(), raw.end());
  std::span<float> logits(scratch.logits);
  for (const auto& [id, bias] : p.logit_bias) logits[id] += bias;
  apply_repetition_penalty(logits, p.repetition_penalty, prompt, output, scratch.seen);
  apply_output_penalties(logits, p.frequency_penalty, p.presence_penalty, output, scratch.counts);
  if (!allowed.empty()) apply_allowed(logits, allowed);
  return logits;
}

[[noreturn]] void throw_all_banned() {
  throw Error("sampling: every token has logit -inf (banned by logit_bias or masked); nothing left to sample");
}

// The lowest id holding `max` (torch.argmax's tie rule), `max` being checked_max of the same logits.
int32_t argmax(std::span<const float> logits, float max) {
  if (max == kNegInf) throw_all_banned();
  return static_cast<int32_t>(std::find(logits.begin(), logits.end(), max) - logits.begin());
}

// A token more than this many temperature-scaled nats below the best has weight < e^-80 relative to it: all 262144
// such tokens together hold < 1e-29 of the mass, far below float32 resolution (vLLM's softmax is float32), so
// leaving them out changes no draw, and it keeps expf off its slow underflow path.
constexpr float kNegligibleLogWeight = 80.0f;

constexpr auto by_rank = [](const Candidate& a, const Candidate& b) { return ranks_above(a, b); };

// Tokens with logit >= floor, and of those the best k (k <= 0: all). With a limit, a bounded heap holds the k best
// seen so far with the worst at its front; once it is full, most tokens cost one comparison with that worst logit.
void collect_candidates(std::span<const float> logits, float floor, int32_t k, std::vector<Candidate>& out) {
  out.clear();
  const size_t n = logits.size();
  auto admitted = [&](float l) { return l >= floor && l != kNegInf; };
  if (k <= 0 || static_cast<size_t>(k) >= n) {
    for (size_t i = 0; i < n; ++i)
      if (admitted(logits[i])) out.push_back({logits[i], 0.0f, static_cast<int32_t>(i)});
    return;
  }
  size_t i = 0;
  for (; i < n && out.size() < static_cast<size_t>(k); ++i)
    if (admitted(logits[i])) {
      out.push_back({logits[i], 0.0f, static_cast<int32_t>(i)});
      std::push_heap(out.begin(), out.end(), by_rank);
    }
  // Ids only grow, so a later token with the worst kept logit ranks below it: entering needs a strictly larger logit
  // (which also means it is above the floor).
  float worst = out.empty() ? 0.0f : out.front().logit;
  for (; i < n; ++i) {
    if (!(logits[i] > worst)) continue;
    std::pop_heap(out.begin(), out.end(), by_rank);
    out.back() = {logits[i], 0.0f, static_cast<int32_t>(i)};
    std::push_heap(out.begin(), out.end(), by_rank);
    worst = out.front().logit;
  }
}

void compute_weights(std::span<Candidate> c, float max, float temperature) {
  const float inv_t = 1.0f / temperature;
  for (Candidate& x : c) x.weight = std::exp((x.logit - max) * inv_t);
}

double mass(std::span<const Candidate> c) {
  double sum = 0;
  for (const Candidate& x : c) sum += x.weight;
  return sum;
}

// How many of `c`, taken in rank order, are kept when `above` is the mass ranked above all of them: a token is kept
// while the mass ranked above it is below `target`. Moves those to the front. A quickselect on mass, expected O(n)
// where sorting would be O(n log n).
size_t cut_in_rank_order(std::span<Candidate> c, double above, double target) {
  constexpr size_t kSortBelow = 32;
  size_t lo = 0, hi = c.size();  // invariant: c[0, lo) kept, their mass is in `above`, the cut lies in [lo, hi]
  while (hi - lo > kSortBelow) {
    size_t mid = lo + (hi - lo) / 2;
    std::nth_element(c.begin() + lo, c.begin() + mid, c.begin() + hi, by_rank);
    double left = mass(c.subspan(lo, mid - lo));
    if (above + left >= target) {
      hi = mid;  // c[mid] already has `target` above it
      continue;
    }
    above += left + c[mid].weight;  // c[lo..mid] are all kept
    lo = mid + 1;
  }
  std::sort(c.begin() + lo, c.begin() + hi, by_rank);
  for (size_t i = lo; i < hi; ++i) {
    if (above >= target) return i;
    above += c[i].weight;
  }
  return hi;
}

// Top-p as vLLM does it: in rank order a token is kept while the mass ranked above it is below top_p of the total
// (the smallest set reaching top_p; always the best token). Moves that set to the front of `c` and returns its size.
// Tokens are first bucketed by how far below the best they lie (8 buckets per temperature-scaled nat): buckets
// before the one where the running mass reaches top_p are kept whole, those after it dropped whole, and only that
// crossing bucket is ranked token by token. Bucket order agrees with rank order, so this is exact, and it costs a
// few cheap passes however flat the distribution is.
size_t select_nucleus(std::span<Candidate> c, float max, float temperature, float top_p) {
  constexpr int kBucketsPerNat = 8;
  constexpr int kBuckets = static_cast<int>(kNegligibleLogWeight) * kBucketsPerNat + 1;
  const float scale = kBucketsPerNat / temperature;
  auto bucket_of = [&](const Candidate& x) {
    return static_cast<int>(std::min((max - x.logit) * scale, static_cast<float>(kBuckets - 1)));
  };
  std::array<double, kBuckets> bucket_mass{};
  for (const Candidate& x : c) bucket_mass[bucket_of(x)] += x.weight;
  double total = 0;
  for (double m : bucket_mass) total += m;
  const double target = top_p * total;
  double above = 0;
  int crossing = 0;
  while (crossing < kBuckets - 1 && above + bucket_mass[crossing] < target) above += bucket_mass[crossing++];
  auto whole = std::partition(c.begin(), c.end(), [&](const Candidate& x) { return bucket_of(x) < crossing; });
  auto ranked = std::partition(whole, c.end(), [&](const Candidate& x) { return bucket_of(x) == crossing; });
  size_t kept_whole = whole - c.begin();
  return kept_whole + cut_in_rank_order(std::span(whole, ranked), above, target);
}

// Inverse-CDF draw: u in [0, 1) scaled by the candidates' mass.
int32_t draw_from(std::span<const Candidate> c, double u) {
  double target = u * mass(c);
  for (const Candidate& x : c) {
    target -= x.weight;
    if (target < 0) return x.id;
  }
  return c.back().id;  // rounding left a sliver past the last candidate
}

// Temperature, min-p, top-k, top-p, from logits whose largest value is max: the candidates a draw chooses from,
// with unnormalised weights.
std::span<Candidate> kept_candidates(std::span<const float> logits, float max, const SamplingParams& params,
                                     std::vector<Candidate>& candidates) {
  if (max == kNegInf) throw_all_banned();
  const float t = params.temperature;
  float floor = max - kNegligibleLogWeight * t;
  // min-p keeps p >= min_p * p_max, i.e. (logit - max) / T >= log(min_p).
  if (params.min_p > 0) floor = std::max(floor, max + t * std::log(params.min_p));
  collect_candidates(logits, floor, params.top_k, candidates);
  std::span<Candidate> kept(candidates);
  compute_weights(kept, max, t);
  if (params.top_p < 1) kept = kept.first(select_nucleus(kept, max, t, params.top_p));
  return kept;
}

// One draw with uniform u from what kept_candidates() keeps.
int32_t draw_token(std::span<const float> logits, float max, const SamplingParams& params, double u,
             std::vector<Candidate>& candidates) {
  return draw_from(kept_candidates(logits, max, params, candidates), u);
}

// q(id) of a distribution sorted by id.
float probability_of(const TokenDistribution& d, int32_t id) {
  auto it = std::lower_bound(d.begin(), d.end(), id, [](const auto& e, int32_t x) { return e.first < x; });
  return it != d.end() && it->first == id ? it->second : 0.0f;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

// The N most likely raw tokens, with log-softmax values, most likely first.
std::vector<std::pair<int32_t, float>> top_raw_logprobs(std::span<const float> raw, int32_t n, double log_norm,
                                                        std::vector<Candidate>& best) {
  collect_candidates(raw, kNegInf, n, best);
  std::sort(best.begin(), best.end(), by_rank);
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(best.size());
  for (const Candidate& c : best) out.emplace_back(c.id, static_cast<float>(c.logit - log_norm));
  return out;
}

void fill_logprobs(std::span<const float> raw, float raw_max, const SamplingParams& p, SampledToken& token,
                   Scratch& scratch) {
  if (!p.logprobs) {
    token.logprob = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float floor = raw_max - kNegligibleLogWeight;
  double sum = 0;
  for (float l : raw)
    if (l >= floor) sum += std::exp(l - raw_max);
  const double log_norm = raw_max + std::log(sum);  // log-sum-exp
  token.logprob = static_cast<float>(raw[token.id] - log_norm);
  if (p.top_logprobs > 0) token.top_logprobs = top_raw_logprobs(raw, p.top_logprobs, log_norm, scratch.candidates);
}

}  // namespace

void SamplingParams::validate() const {
  require(std::isfinite(temperature) && temperature >= 0,
          fmt::format("temperature must be a finite number >= 0, got {}", temperature));
  require(top_k >= -1, fmt::format("top_k must be -1 or 0 (no limit) or a positive count, got {}", top_k));
  require(top_p > 0 && top_p <= 1, fmt::format("top_p must be in (0, 1], got {}", top_p));
  require(min_p >= 0 && min_p <= 1, fmt::format("min_p must be in [0, 1], got {}", min_p));
  require(std::isfinite(repetition_penalty) && repetition_penalty > 0,
          fmt::format("repetition_penalty must be a finite number > 0, got {}", repetition_penalty));
  require(presence_penalty >= -2 && presence_penalty <= 2,
          fmt::format("presence_penalty must be in [-2, 2], got {}", presence_penalty));
  require(frequency_penalty >= -2 && frequency_penalty <= 2,
          fmt::format("frequency_penalty must be in [-2, 2], got {}", frequency_penalty));
  for (const auto& [id, bias] : logit_bias) {
    require(id >= 0, fmt::format("logit_bias: token id must be >= 0, got {}", id));
    require(!std::isnan(bias) && bias != std::numeric_limits<float>::infinity(),
            fmt::format("logit_bias for token {} must be a finite number or -inf, got {}", id, bias));
  }
  require(top_logprobs >= 0 && top_logprobs <= kMaxTopLogprobs,
          fmt::format("top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, top_logprobs));
  require(top_logprobs == 0 || logprobs, "top_logprobs needs logprobs to be true");
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
  seed_ = mix64(params_.seed ? *params_.seed ^ kGoldenGamma : fresh_seed());
}

double Sampler::next_uniform() {
  uint64_t bits = mix64(seed_ + (++draws_) * kGoldenGamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// The raw logits' maximum and the adjusted logits (bias, penalties, mask) with theirs: what every way of picking
// a token starts from.
struct Sampler::Prepared {
  float raw_max, max;
  std::span<const float> adjusted;
  Scratch& scratch;
};

Sampler::Prepared Sampler::prepare(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                                   std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed) {
  if (logits.empty()) throw Error("sampling: the logits are empty; expected one value per vocabulary token");
  const size_t vocab = logits.size();
  check_token_ids(prompt_tokens, vocab, "prompt tokens");
  check_token_ids(output_tokens, vocab, "output tokens");
  for (const auto& [id, bias] : params_.logit_bias)
    if (static_cast<size_t>(id) >= vocab)
      throw Error(fmt::format("logit_bias: token id {} is outside the vocabulary of {} tokens", id, vocab));
  const float raw_max = checked_max(logits, "logits");

  Scratch& scratch = thread_scratch();
  std::span<const float> adjusted = adjusted_logits(logits, params_, prompt_tokens, output_tokens, allowed, scratch);
  // A mask alone only turns checked logits into -inf: their plain maximum needs no second check (whose NaN probe
  // would send every masked token through the slow scalar scan).
  const float max = adjusted.data() == logits.data() ? raw_max
                    : changes_logits(params_, {})    ? checked_max(adjusted, "logits after logit_bias and penalties")
                                                     : plain_max(adjusted);
  return {raw_max, max, adjusted, scratch};
}

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed) {
  Prepared p = prepare(logits, prompt_tokens, output_tokens, allowed);
  SampledToken token;
  token.id = params_.greedy() ? argmax(p.adjusted, p.max)
                              : draw_token(p.adjusted, p.max, params_, next_uniform(), p.scratch.candidates);
  fill_logprobs(logits, p.raw_max, params_, token, p.scratch);
  return token;
}

TokenDistribution Sampler::distribution(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                                        std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed) {
  Prepared p = prepare(logits, prompt_tokens, output_tokens, allowed);
  if (params_.greedy()) return {{argmax(p.adjusted, p.max), 1.0f}};
  std::span<const Candidate> kept = kept_candidates(p.adjusted, p.max, params_, p.scratch.candidates);
  const double total = mass(kept);
  TokenDistribution d;
  d.reserve(kept.size());
  for (const Candidate& c : kept) d.emplace_back(c.id, static_cast<float>(c.weight / total));
  std::sort(d.begin(), d.end());
  return d;
}

int32_t Sampler::draw(const TokenDistribution& d) {
  if (d.empty()) throw Error("sampling: an empty draft distribution");
  double target = next_uniform();
  for (const auto& [id, p] : d) {
    target -= p;
    if (target < 0) return id;
  }
  return d.back().first;
}

SampledToken Sampler::verify(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed, int32_t draft,
                             const TokenDistribution& draft_distribution) {
  if (params_.greedy()) return sample(logits, prompt_tokens, output_tokens, allowed);
  Prepared p = prepare(logits, prompt_tokens, output_tokens, allowed);
  std::span<Candidate> kept = kept_candidates(p.adjusted, p.max, params_, p.scratch.candidates);
  const double total = mass(kept);
  auto q = [&](int32_t id) {
    return draft_distribution.empty() ? (id == draft ? 1.0f : 0.0f) : probability_of(draft_distribution, id);
  };
  double p_draft = 0;
  for (const Candidate& c : kept)
    if (c.id == draft) p_draft = c.weight / total;
  SampledToken token;
  const double q_draft = q(draft);
  if (q_draft > 0 && next_uniform() * q_draft < p_draft) {
    token.id = draft;
  } else {
    // The residual max(p - q, 0) as weights on the kept candidates (p is 0 elsewhere). When rounding leaves it
    // empty (p == q up to float precision, where a rejection has probability ~0), p itself.
    double residual = 0;
    for (Candidate& c : kept) residual += c.weight = static_cast<float>(std::max(0.0, c.weight / total - q(c.id)));
    if (residual <= 0) compute_weights(kept, p.max, params_.temperature);
    token.id = draw_from(kept, next_uniform());
  }
  fill_logprobs(logits, p.raw_max, params_, token, p.scratch);
  return token;
}

}  // namespace qs
