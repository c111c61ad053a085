#include "server/response_store.h"

namespace qs {

namespace {

size_t json_bytes(const StoredResponse& entry) {
  using ojson = nlohmann::ordered_json;
  using json = nlohmann::json;
  return entry.response.dump(-1, ' ', false, ojson::error_handler_t::replace).size() +
         entry.conversation.dump(-1, ' ', false, json::error_handler_t::replace).size();
}

}  // namespace

void ResponseStore::put(const std::string& id, StoredResponse entry) {
  const size_t size = json_bytes(entry);
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (size > max_bytes_ || max_entries_ == 0) return;
  lru_.push_front(Entry{id, std::move(entry), size});
  index_[id] = lru_.begin();
  bytes_ += size;
  evict_locked();
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

// The least recently used go first, until both bounds hold.
void ResponseStore::evict_locked() {
  while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

}  // namespace qs
