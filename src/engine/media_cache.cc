#include "engine/media_cache.h"

namespace qs {

namespace {
uint64_t bytes_of(const std::vector<float>& v) { return v.size() * sizeof(float); }
}  // namespace

const std::vector<float>* MediaEmbeddingCache::find(const MediaKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it->second);
  return &it->second->second;
}

void MediaEmbeddingCache::insert(const MediaKey& key, const std::vector<float>& embeddings) {
  const uint64_t size = bytes_of(embeddings);
  if (max_bytes_ == 0 || size > max_bytes_ || index_.contains(key)) return;
  while (bytes_ + size > max_bytes_) {
    bytes_ -= bytes_of(entries_.back().second);
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
  entries_.emplace_front(key, embeddings);
  index_[key] = entries_.begin();
  bytes_ += size;
}

}  // namespace qs
