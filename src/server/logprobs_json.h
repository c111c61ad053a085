#pragma once
// Logprobs as the OpenAI APIs write them: a chat choice's {"content": [{token, logprob, bytes, top_logprobs}]} and a
// completion choice's legacy {tokens, token_logprobs, top_logprobs, text_offset}, the latter also over an echoed
// prompt (completions' echo: the prompt's tokens first, the first of them with null logprobs, as OpenAI and vLLM
// write it).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "engine/sampler.h"

namespace qs {

class Tokenizer;

struct LogprobOptions {
  bool enabled = false;
  int32_t top = 0;                 // alternatives per position
  bool tokens_as_ids = false;      // vLLM's return_tokens_as_token_ids: tokens written "token_id:<id>"
};

// The logprobs object of a chat choice ({"content": [...]}) or a completion choice ({"tokens", ...}) for
// `tokens`; text_offset counts characters from `text_offset` on (completions).
nlohmann::ordered_json chat_logprobs(std::span<const SampledToken> tokens, const LogprobOptions& options,
                                     const Tokenizer& tokenizer);
nlohmann::ordered_json completion_logprobs(std::span<const SampledToken> tokens, const LogprobOptions& options,
                                           const Tokenizer& tokenizer, int64_t& text_offset);

// A completion choice's logprobs with its prompt echoed: `prompt` (token ids) with `prompt_scores` (tokens 1..n-1
// scored: EngineEvent::prompt_logprobs), then the generated `tokens`; text_offset counts from `text_offset` on
// (0 for the choice's start) through the prompt's text into the completion's, and is left after the last token.
nlohmann::ordered_json echo_completion_logprobs(std::span<const int32_t> prompt,
                                                std::span<const SampledToken> prompt_scores,
                                                std::span<const SampledToken> tokens, const LogprobOptions& options,
                                                const Tokenizer& tokenizer, int64_t& text_offset);

}  // namespace qs
