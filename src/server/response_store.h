#pragma once
// The responses `POST /v1/responses` keeps (store: true, the default), so that a later request continues one with
// previous_response_id and GET / DELETE /v1/responses/{id} find it. In memory only (a restart forgets them), bounded
// by an entry count and by the bytes of their JSON text (serve --responses-max-entries, --responses-max-mb): past
// either bound the least recently used responses (stored, read or continued) are dropped. A response larger than the
// whole byte bound is not kept.
#include <cstddef>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace qs {

struct StoredResponse {
  nlohmann::ordered_json response;  // the response object as GET returns it
  // The conversation as Responses input items: the previous response's (when continued), this request's input,
  // then this response's output items (reasoning and function calls included), ready to be continued.
  nlohmann::json conversation = nlohmann::json::array();
};

class ResponseStore {
 public:
  ResponseStore(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

  void put(const std::string& id, StoredResponse entry);
  std::optional<StoredResponse> get(const std::string& id);  // and marks it recently used
  bool erase(const std::string& id);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    std::string id;
    StoredResponse value;
    size_t bytes = 0;
  };
  void evict_locked();

  size_t max_entries_, max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace qs
