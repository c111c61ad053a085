#pragma once
// The added tokens of a tokenizer.json (tokenizers' `AddedVocabulary`): strings cut out of the text before the
// other stages see it, leftmost-longest, with lstrip, rstrip and single_word as the file sets them. Those with
// normalized=false are matched in the raw text, those with normalized=true in the normalized pieces.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/string_hash.h"
#include "text/tokenizer_json.h"

namespace qs::text {

class Normalizer;
class VocabIndex;

// Byte trie of added tokens, for leftmost-longest matching.
class TokenTrie {
 public:
  void insert(std::string_view s, int32_t value);
  bool empty() const { return empty_; }

  struct Match {
    size_t begin, end;
    int32_t value;
  };
  // Next leftmost-longest match starting at or after `pos`, or false.
  bool find(std::string_view text, size_t pos, Match& m) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> kids;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
};

// A piece of text: an added token's id, or -1 for text between added tokens.
struct AddedSplit {
  size_t begin, end;
  int32_t id;  // -1: not an added token
};

class AddedVocabulary {
 public:
  // Reads "added_tokens" (null: none). Ids are assigned as tokenizers does: the vocabulary id if the string is in
  // model.vocab, else the next id from model.vocab's size; the "id" written in the file is not used. `max_id` grows
  // to the largest id given.
  void parse(const json* list, const VocabIndex& vocab, const JsonFields& fields, int64_t& max_id);
  // Fills the matchers; returns, per token, the string it stands for (its normalized form when normalized=true).
  std::vector<std::string> build_matchers(const Normalizer& normalizer);

  // `s` cut at the added tokens of `trie`: added-token ids and the text between them, in order.
  std::vector<AddedSplit> split(std::string_view s, const TokenTrie& trie) const;

  std::vector<AddedToken> tokens;  // by insertion; trie values index this
  StringMap ids;                   // content -> id
  TokenTrie raw_trie, normalized_trie;
};

}  // namespace qs::text
