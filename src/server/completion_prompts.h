#pragma once
// The prompts of a POST /v1/completions body and its echo field, as OpenAI and vLLM take them: "prompt" is a string,
// a list of token ids, or a batch (a list of strings and token-id lists), each prompt getting its own n choices in
// order; "echo" puts each prompt before its completion (text and, with logprobs, its scored tokens). Errors are
// ApiError 400s naming the field.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_protocol.h"

namespace qs {

inline constexpr size_t kMaxBatchPrompts = 256;

struct CompletionPrompt {
  std::vector<int32_t> tokens;  // a string gets the BOS token first, as the tokenizer's post-processor adds it
  std::string text;             // what echo writes: the string as given, or the token ids decoded
};

std::vector<CompletionPrompt> parse_completion_prompts(const nlohmann::json& prompt, const ServedModel& model);

// Whether the body asks for echo; with it, n > 1 and best_of are refused (param "n", "best_of").
bool parse_echo(const nlohmann::json& body);

}  // namespace qs
