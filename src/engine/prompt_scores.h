#pragma once
// Prompt scoring (vLLM's prompt_logprobs; OpenAI completions' echo with logprobs, what lm-evaluation-harness's
// log-likelihood tasks read): every prompt token's log-probability under the model given the tokens before it, from
// the logits the prefill computes at the position before it. Like the sampler's logprobs these are the raw model's
// log-softmax, before any bias, penalty or temperature.
#include <cstdint>
#include <span>

#include "engine/sampler.h"

namespace qs {

// The token `id` scored by the logits of the position before it (one row over the whole vocabulary): its
// log-softmax, and the `alternatives` most likely tokens' (most likely first, ties by id), as SampledToken carries a
// sampled token's.
SampledToken score_token(std::span<const float> logits, int32_t id, int32_t alternatives);

}  // namespace qs
