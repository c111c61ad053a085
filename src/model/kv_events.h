#pragma once
// KV events: what enters and leaves the prefix cache, in vLLM's terms (vllm/distributed/kv_events.py), for a
// prefix-aware router that follows each replica (llm-d's KV-cache indexer). The pool (kv_cache.h) records them here
// on the engine thread; the engine hands each step's events to a publisher (server/kv_events_publisher.h) as one
// batch.
//
// What is reported: a prefix block, under its vLLM block hash (kv_block_hash.h), when its full-attention block
// enters the prefix cache (BlockStored) and when that block is evicted (BlockRemoved); AllBlocksCleared when the
// cache starts empty. Gemma 4 is a hybrid model: a cached prefix needs its full-attention blocks and, for the last
// window before its end, its sliding-window blocks. vLLM's hybrid models publish each KV cache group's blocks
// under the same hash, so a consumer that keys blocks by hash alone sees a hash removed while another group still
// holds it; here the full-attention block alone stands for the prefix (a model with no full-attention layers
// reports its sliding-window blocks), and a reported prefix whose window's sliding blocks were evicted is adopted
// up to the last block whose window is still cached. Blocks spilled to the disk tier are removed (medium "GPU",
// vLLM's name for the engine's own KV pool, leaves) and stored again when read back.
#include <cstdint>
#include <optional>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "model/kv_block_hash.h"

namespace qs {

struct KvEvent {
  enum class Kind { BlockStored, BlockRemoved, AllBlocksCleared };
  Kind kind = Kind::BlockStored;
  std::vector<uint64_t> block_hashes;      // vLLM's integer form
  std::optional<uint64_t> parent_block_hash;  // BlockStored: none for a sequence's first block
  std::vector<int32_t> token_ids;          // BlockStored: every token of the blocks, in order
};

class KvEventLog {
 public:
  explicit KvEventLog(int64_t block_size, std::string hash_seed)
      : block_size_(block_size), none_hash_(vllm_none_hash(hash_seed)) {}

  int64_t block_size() const { return block_size_; }
  const VllmBlockHash& none_hash() const { return none_hash_; }

  // A block entered the cache. Consecutive blocks of one chain join one BlockStored, as vLLM's do.
  void stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens);
  void removed(uint64_t hash);
  void cleared();

  // The events since the last call, in order.
  std::vector<KvEvent> take() { return std::exchange(pending_, {}); }

 private:
  int64_t block_size_;
  VllmBlockHash none_hash_;
  std::vector<KvEvent> pending_;
};

}  // namespace qs
