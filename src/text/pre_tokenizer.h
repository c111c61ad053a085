#pragma once
// The pre-tokenizer stage of a tokenizer.json (tokenizers' `pre_tokenizers`): Split on a literal pattern with any
// behavior, and Sequence of those; it cuts normalized text into the words the BPE model sees.
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_json.h"

namespace qs::text {

class PreTokenizer {
 public:
  // Reads the "pre_tokenizer" object (null: none); other pre-tokenizer types are refused through `fields`.
  static PreTokenizer parse(const json* pre_tokenizer, const JsonFields& fields);

  // Words of `s`, views into it, in order (empty pieces dropped).
  void split(std::string_view s, std::vector<std::string_view>& words) const;

  enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct SplitStep {
    std::string pattern;
    SplitBehavior behavior;
    bool invert;
  };

 private:
  void parse_step(const json& n, const std::string& where, const JsonFields& fields);

  std::vector<SplitStep> steps_;
};

}  // namespace qs::text
