#pragma once
// Picking the next token from one sequence's logits, with vLLM's (V1) order and semantics:
//   1. logit_bias is added (-inf bans a token)
//   2. repetition penalty over prompt + output tokens (positive logits divided, negative multiplied), then
//      frequency and presence penalties over output tokens (OpenAI: logit -= f * count + p * [count > 0])
//   3. temperature 0 (below 1e-5) -> greedy: the argmax of those logits; top-k/top-p/min-p cannot change it
//   4. otherwise temperature, then min-p (relative to the most likely token), then top-k, then top-p on what is
//      left, renormalised; then one draw from a generator seeded per request.
// Logprobs are the log-softmax of the raw logits, before any bias, penalty, temperature or truncation (vLLM's
// default logprobs mode "raw_logprobs"), so they describe the model, not the sampling settings.
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace qs {

inline constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's limit and vLLM's default max_logprobs

struct SamplingParams {
  float temperature = 1.0f;                           // 0 (below 1e-5, vLLM's epsilon) = greedy
  int32_t top_k = 0;                                  // 0 or -1 = off
  float top_p = 1.0f;                                 // in (0, 1]; 1 = off
  float min_p = 0.0f;                                 // in [0, 1]; 0 = off
  float repetition_penalty = 1.0f;                    // > 0; 1 = off
  float presence_penalty = 0.0f;                      // in [-2, 2]
  float frequency_penalty = 0.0f;                     // in [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit; -inf bans it
  std::optional<uint64_t> seed;  // same seed and same logits -> same tokens; none -> a fresh seed per Sampler
  bool logprobs = false;         // report the chosen token's logprob
  int32_t top_logprobs = 0;      // and the N most likely tokens' (needs logprobs)

  // Throws qs::Error naming the first bad parameter, e.g. "top_p must be in (0, 1], got 1.5".
  void validate() const;
  bool greedy() const { return temperature < 1e-5f; }
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0;  // of `id` under the raw distribution; NaN when logprobs were not requested
  std::vector<std::pair<int32_t, float>> top_logprobs;  // most likely first, ties by id
};

// A distribution over token ids: (id, probability) by ascending id, probabilities summing to 1; tokens absent have 0.
using TokenDistribution = std::vector<std::pair<int32_t, float>>;

// One request's sampler. Not thread-safe (it counts its draws); the vocab-sized scratch it works in belongs to
// the calling thread and is reused across calls and samplers, so per call it allocates only the result.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // validates

  // logits: one position's logits over the whole vocab. prompt_tokens / output_tokens: the sequence so far, for
  // the penalties. allowed: when not empty, one bit per token id (constrained decoding): tokens without their bit
  // are banned like a -inf logit_bias; logprobs stay the raw model's (as vLLM). Throws qs::Error for a token id
  // outside the vocab or when every token is banned.
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed = {});

  // The distribution sample() draws from for these logits (greedy: the argmax with probability 1). Same arguments.
  TokenDistribution distribution(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                                 std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed = {});
  // One draw from `d` (a draft model's proposal).
  int32_t draw(const TokenDistribution& d);

  // Speculative decoding: the token at this position given that a drafter proposed `draft`, drawn from
  // `draft_distribution` (empty: a point mass on `draft`, as n-gram drafting proposes). Greedy: the argmax, as
  // sample() picks it. Otherwise standard rejection sampling (Leviathan et al. 2023, Chen et al. 2023): with p
  // what sample() would draw from and q the draft distribution, `draft` is kept with probability
  // min(1, p(draft) / q(draft)), else a token is drawn from max(p - q, 0) renormalised; the result is distributed
  // exactly as p, and equals `draft` exactly when the draft is accepted. Same arguments and logprobs as sample().
  SampledToken verify(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed, int32_t draft,
                      const TokenDistribution& draft_distribution);

  const SamplingParams& params() const { return params_; }

 private:
  double next_uniform();  // in [0, 1)
  struct Prepared;
  Prepared prepare(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                   std::span<const int32_t> output_tokens, std::span<const uint64_t> allowed);

  SamplingParams params_;
  uint64_t seed_;
  uint64_t draws_ = 0;
};

}  // namespace qs
