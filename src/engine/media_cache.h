#pragma once
// Soft tokens of media already encoded, keyed by content (MediaKey), bounded by bytes, least recently used out
// first: the same image in the next turn of a conversation is not sent through its tower again. Not thread-safe:
// the engine thread owns it.
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/media_prompt.h"

namespace qs {

class MediaEmbeddingCache {
 public:
  explicit MediaEmbeddingCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The soft tokens stored under `key` (now the most recently used), or nothing.
  const std::vector<float>* find(const MediaKey& key);
  // Stores a copy (evicting the least recently used entries to make room); an entry larger than the whole budget,
  // or any entry with a budget of 0, is not stored.
  void insert(const MediaKey& key, const std::vector<float>& embeddings);

  uint64_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }

 private:
  struct KeyHash {
    size_t operator()(const MediaKey& k) const { return static_cast<size_t>(k.hi ^ (k.lo * 0x9e3779b97f4a7c15ull)); }
  };
  using Entry = std::pair<MediaKey, std::vector<float>>;
  uint64_t max_bytes_, bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<MediaKey, std::list<Entry>::iterator, KeyHash> index_;
};

}  // namespace qs
