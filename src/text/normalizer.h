#pragma once
// The normalizer stage of a tokenizer.json (tokenizers' `normalizers`): Replace with a literal pattern, Prepend, and
// Sequence of those, applied to each piece of text between added tokens.
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_json.h"

namespace qs::text {

class Normalizer {
 public:
  // Reads the "normalizer" object (null: none); other normalizer types are refused through `fields`.
  static Normalizer parse(const json* normalizer, const JsonFields& fields);

  bool empty() const { return steps_.empty(); }
  void normalize(std::string_view in, std::string& out) const;

 private:
  struct Step {
    bool prepend;  // else Replace
    std::string pattern, content;
  };
  void parse_step(const json& n, const std::string& where, const JsonFields& fields);

  std::vector<Step> steps_;
};

// Non-overlapping occurrences of a non-empty literal, left to right (what a regex of the escaped literal finds).
// The Replace decoder uses it too: in tokenizers, decoders' Replace is this same normalizer.
std::string replace_all(std::string_view s, std::string_view pattern, std::string_view with);

}  // namespace qs::text
