#pragma once
// What an engine reports of itself (Engine::stats()): the server's /metrics and /health read it.
#include <cstdint>
#include <vector>

#include "engine/lora_loads.h"
#include "model/kv_disk_tier.h"

namespace qs {

struct EngineStats {
  int running = 0, waiting = 0;
  int64_t kv_tokens_used = 0, kv_tokens_total = 0;  // positions held in KV caches / the budget
  uint64_t kv_bytes_used = 0, kv_bytes_total = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;  // blocks held by sequences / the pool
  int64_t prefix_hit_tokens = 0;                    // prompt positions adopted from the prefix cache, not computed
  int64_t prefix_query_tokens = 0;                  // positions looked up in the prefix cache by admitted sequences
  int64_t prefix_disk_hit_tokens = 0;  // of prefix_hit_tokens, those in blocks read back from the disk tier
  bool prefix_disk = false;            // whether the prefix cache has a disk tier (--prefix-cache-dir)
  DiskTierStats prefix_disk_stats;     // its files and traffic
  uint64_t preemptions = 0;                         // sequences sent back to recompute for want of KV blocks
  uint64_t steps = 0;
  uint64_t media_encodes = 0;     // images and clips sent through their tower
  uint64_t media_cache_hits = 0;  // images and clips whose soft tokens came from the media cache instead
  uint64_t spec_drafts = 0;          // speculative verifications with at least one draft token
  uint64_t spec_draft_tokens = 0;    // draft tokens proposed and verified
  uint64_t spec_accepted_tokens = 0; // of those, accepted
  // [i]: draft tokens at position i of their draft (0: the first), verified and accepted (vLLM's
  // spec_decode_num_accepted_tokens_per_pos): the acceptance rate per draft position.
  std::vector<uint64_t> spec_draft_tokens_per_pos, spec_accepted_tokens_per_pos;
  std::vector<LoraLoad> lora_loads;  // per LoRA adapter that ever had a sequence, by name (lora_loads.h)
};

}  // namespace qs
