#pragma once
// The BPE model of a tokenizer.json (tokenizers' `models::bpe`): model.vocab, model.merges and the options
// byte_fallback, unk_token, fuse_unk and ignore_merges. Each word becomes one symbol per character (a vocab char,
// else its bytes as <0xXX> tokens when byte_fallback is set, else the unk token, fused when fuse_unk is set), then
// merges are applied lowest rank first, leftmost first among equal ranks.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/string_hash.h"
#include "text/tokenizer_json.h"

namespace qs::text {

// String -> id for model.vocab, the strings themselves being kept by id in `strings` (open addressing; a slot holds
// a hash tag and the id). About twice as fast to build and query as an unordered_map of 262k strings.
class VocabIndex {
 public:
  explicit VocabIndex(const std::vector<std::string>* strings) : strings_(strings) {}
  void reserve(size_t n);
  // The id of `s`, or -1.
  int32_t find(std::string_view s) const;
  // Points `s` (already stored at strings[id]) at `id`; returns the id it pointed at before, or -1.
  int32_t assign(std::string_view s, int32_t id);
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint32_t tag;
    int32_t id;
  };
  const std::vector<std::string>* strings_;
  std::vector<Slot> slots_{Slot{0, -1}};
  size_t mask_ = 0, size_ = 0;
};

// (left id, right id) -> (rank, merged id): open addressing, linear probing.
class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  // Later insertions of the same pair win (as collecting tokenizers' merges into a HashMap does).
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const;

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const {
    return shift_ >= 64 ? 0 : static_cast<size_t>(((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  struct Slot {
    uint64_t key;
    Value value;
  };
  std::vector<Slot> slots_{Slot{kEmpty, {0, -1}}};
  size_t mask_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // `pieces`: model.vocab strings by id, filled by the caller before build_tables(); `vocab` indexes them.
  explicit BpeModel(const std::vector<std::string>* pieces) : vocab(pieces) {}

  // Reads and checks the "model" object's type and options (the vocabulary and merges come as `file`'s vectors).
  void parse_options(const TokenizerJson& file, const JsonFields& fields);
  // Per-character tables from the vocabulary strings (by id, "" where an id has none).
  void build_tables(const std::vector<std::string>& pieces);
  // Merges: rank = position in the list; both parts and their concatenation must be vocabulary strings.
  void add_merges(const std::vector<std::pair<std::string, std::string>>& merges, const JsonFields& fields);

  // Appends the ids of one pre-token. Thread-safe (the word cache is shared).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // Empties the cache of results per word.
  void clear_cache() const;

  VocabIndex vocab;  // model.vocab: string -> id

 private:
  static constexpr size_t kMaxCachedChunk = 256;  // bytes; longer chunks are always merged afresh
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 1 << 15;

  void tokenize_chunk(std::string_view chunk, std::vector<int32_t>& out) const;
  void tokenize_chunk_uncached(std::string_view chunk, std::vector<int32_t>& out) const;

  std::string source_;                // file name for messages
  std::vector<int32_t> cp_to_id_;      // code point -> vocab id of that one-character string, or -1
  std::array<int32_t, 256> byte_ids_;  // <0xXX> ids, or -1
  PairMap merges_;
  int32_t unk_id_ = -1;
  std::string unk_token_;
  bool has_unk_ = false, fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  // Word chunking: a pre-token may be cut before a "▁" that follows character c (c != "▁", c a vocab character)
  // when no vocabulary string contains c + "▁": no merge can then span that point, so BPE on the pieces gives
  // exactly BPE on the whole word, and the pieces ("▁word") repeat enough to be cached.
  bool chunking_ = false;
  std::vector<uint32_t> unsafe_before_metaspace_;  // sorted code points c with c + "▁" inside some vocab string

  // Cache of BPE results per chunk.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace qs::text
