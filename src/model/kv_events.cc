#include "model/kv_events.h"

namespace qs {

void KvEventLog::stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens) {
  if (!pending_.empty()) {
    KvEvent& last = pending_.back();
    if (last.kind == KvEvent::Kind::BlockStored && parent && last.block_hashes.back() == *parent ) {
      last.block_hashes.push_back(hash);
      last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  pending_.push_back({KvEvent::Kind::BlockStored, {hash}, parent, {tokens.begin(), tokens.end()}});
}

void KvEventLog::removed(uint64_t hash) {
  if (!pending_.empty() && pending_.back().kind == KvEvent::Kind::BlockRemoved) {
    pending_.back().block_hashes.push_back(hash);
    return;
  }
  pending_.push_back({KvEvent::Kind::BlockRemoved, {hash}, std::nullopt, {}});
}

void KvEventLog::cleared() { pending_.push_back({KvEvent::Kind::AllBlocksCleared, {}, std::nullopt, {}}); }

}  // namespace qs
