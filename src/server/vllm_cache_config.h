#pragma once
// vllm:cache_config_info: vLLM's gauge of value 1 labelled with its CacheConfig.metrics_info() (vllm/config/cache.py:
// str() of every field of the dataclass's __dict__, in declaration order, then engine; vLLM 0.34.0's keys, recorded
// in tests/data/vllm_metrics.json), filled with the KV pool serve runs: block_size, cache_dtype, num_gpu_blocks (the
// blocks of the full-attention layers, so that num_gpu_blocks * block_size = kv_cache_size_tokens, the positions one
// layer class holds), enable_prefix_caching (always on), hash_block_size and cache_hit_alignment_tokens (prefix-cache
// keys and hits are per block), kv_cache_max_concurrency (positions / max model length), kv_cache_memory_bytes
// (--kv-memory), prefix_caching_hash_algo (sha256_cbor with --kv-events-endpoint: the hashes routers see). The keys
// that do not apply (Mamba, offloading, GPU memory fraction, ...) hold the value of a default CacheConfig.
#include <cstdint>
#include <string>
#include <string_view>

#include "server/metrics.h"

namespace qs {

struct KvCacheFacts {
  int64_t block_size = 0;     // positions per block
  int64_t blocks = 0;         // blocks of the full-attention layers (Engine::kv_blocks_total)
  int64_t tokens = 0;         // positions they hold (EngineStats::kv_tokens_total)
  int64_t max_model_len = 0;  // Engine::max_context
  std::string kv_dtype;       // "f32", "bf16" or "int8" (Engine::kv_dtype)
  uint64_t kv_memory = 0;     // --kv-memory; 0: from the memory plan
  bool kv_events = false;     // --kv-events-endpoint
};

// The labels of vllm:cache_config_info, in vLLM's order, engine="0" last.
MetricLabels vllm_cache_config_labels(const KvCacheFacts& kv);

// vLLM's --kv-cache-dtype for qatserve's: bfloat16, int8_per_token_head (one scale per position and KV head), and
// float32 (no vLLM value: vLLM's auto would be the model's dtype).
std::string_view vllm_cache_dtype(std::string_view kv_dtype);

// Python's str() of a float: shortest round trip, ".0" on whole numbers.
std::string python_float_str(double value);

}  // namespace qs
