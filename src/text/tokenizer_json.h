#pragma once
// Reading a Hugging Face tokenizer.json: the streaming parse, and the field readers every stage's loader uses, whose
// errors are qs::Errors that start with the file name and name the offending field.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qs::text {

using json = nlohmann::json;

// A parsed tokenizer.json: model.vocab and model.merges (~780k entries in the Gemma files) as plain vectors, in file
// order; everything else as a small DOM in `root`.
struct TokenizerJson {
  json root;
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool vocab_seen = false, merges_seen = false;
};

// Field readers for one file; `where` is the JSON path of `obj` in messages ("model", "decoder.decoders[1]").
class JsonFields {
 public:
  explicit JsonFields(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& why) const;
  // obj[key], or null when absent.
  static const json* member(const json& obj, const char* key);
  // obj[key] as a bool; `dflt` when absent or null.
  bool get_bool(const json& obj, const char* key, bool dflt, const std::string& where) const;
  std::string get_string(const json& obj, const char* key, const std::string& where) const;
  // The "type" of a stage object.
  std::string type_of(const json& obj, const std::string& where) const;
  // A non-empty {"String": ...} pattern (regex patterns are refused: they cannot be reproduced exactly here).
  std::string literal_pattern(const json& obj, const std::string& where) const;

 private:
  std::string source_;  // file name for messages
};

// Parses `json_text` (a JSON syntax error or a malformed vocab/merges entry fails through `fields`).
TokenizerJson read_tokenizer_json(std::string_view json_text, const JsonFields& fields);

}  // namespace qs::text
