#include "engine/speculative_config.h"

#include <fmt/format.h>

#include "util/error.h"

namespace qs {

SpeculativeMethod parse_speculative_method(const std::string& name) {
  if (name == "none") return SpeculativeMethod::None;
  if (name == "ngram") return SpeculativeMethod::Ngram;
  if (name == "draft_model") return SpeculativeMethod::DraftModel;
  if (name == "assistant") return SpeculativeMethod::Assistant;
  throw Error(fmt::format("speculative method \"{}\": expected none, ngram, draft_model or assistant", name));
}

std::string_view speculative_method_name(SpeculativeMethod m) {
  switch (m) {
    case SpeculativeMethod::None: return "none";
    case SpeculativeMethod::Ngram: return "ngram";
    case SpeculativeMethod::DraftModel: return "draft_model";
    case SpeculativeMethod::Assistant: return "assistant";
  }
  return "none";
}

void SpeculativeConfig::validate() const {
  if (num_speculative_tokens < 1 || num_speculative_tokens > kMaxSpeculativeTokens)
    throw Error(fmt::format("num_speculative_tokens must be in [1, {}], got {}", kMaxSpeculativeTokens,
                            num_speculative_tokens));
  if (prompt_lookup_min < 1 || prompt_lookup_max < prompt_lookup_min || prompt_lookup_max > 64)
    throw Error(fmt::format("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max <= 64, got {} and {}",
                            prompt_lookup_min, prompt_lookup_max));
}

}  // namespace qs
