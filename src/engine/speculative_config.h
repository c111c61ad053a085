#pragma once
// What a request or the server asks of speculative decoding (engine/speculative.h does it): parsed apart from the
// drafters so that the request parser (and its fuzz target) need no model.
#include <cstdint>
#include <string>
#include <string_view>

namespace qs {

enum class SpeculativeMethod { None, Ngram, DraftModel, Assistant };
SpeculativeMethod parse_speculative_method(const std::string& name);  // "none" | "ngram" | "draft_model" | "assistant"
std::string_view speculative_method_name(SpeculativeMethod m);

// vLLM's speculative_config names.
struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::None;
  int64_t num_speculative_tokens = 4;  // draft tokens verified per step, at most
  int64_t prompt_lookup_min = 1;       // ngram: shortest suffix looked up
  int64_t prompt_lookup_max = 4;       // ngram: longest suffix looked up (tried first)

  bool enabled() const { return method != SpeculativeMethod::None && num_speculative_tokens > 0; }
  // Throws qs::Error naming the field and the expected range.
  void validate() const;
};
inline constexpr int64_t kMaxSpeculativeTokens = 16;

}  // namespace qs
