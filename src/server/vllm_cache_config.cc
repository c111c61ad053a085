#include "server/vllm_cache_config.h"

#include <fmt/format.h>

#include <cmath>

namespace qs {

std::string_view vllm_cache_dtype(std::string_view kv_dtype) {
  if (kv_dtype == "bf16") return "bfloat16";
  if (kv_dtype == "int8") return "int8_per_token_head";
  if (kv_dtype == "f32") return "float32";
  return kv_dtype;
}

std::string python_float_str(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e16)
    return fmt::format("{}.0", static_cast<int64_t>(value));
  return fmt::format("{}", value);
}

MetricLabels vllm_cache_config_labels(const KvCacheFacts& kv) {
  const std::string block = std::to_string(kv.block_size), none = "None";
  const std::string concurrency =
      kv.max_model_len > 0 ? python_float_str(static_cast<double>(kv.tokens) / static_cast<double>(kv.max_model_len))
                           : none;
  return {
      {"block_size", block},
      {"user_specified_block_size", "False"},
      {"kv_cache_layout", none},
      {"prefix_match_unit", none},
      {"gpu_memory_utilization", none},
      {"cache_dtype", std::string(vllm_cache_dtype(kv.kv_dtype))},
      {"is_attention_free", "False"},
      {"num_gpu_blocks_override", none},
      {"sliding_window", none},
      {"enable_prefix_caching", "True"},
      {"prefix_caching_hash_algo", kv.kv_events ? "sha256_cbor" : "sha256"},
      {"prefix_cache_retention_interval", "0"},
      {"kv_cache_dtype_skip_layers", "[]"},
      {"mamba_page_size_padded", none},
      {"skip_page_size_padded", none},
      {"mamba_block_size", none},
      {"mamba_cache_dtype", "auto"},
      {"mamba_ssm_cache_dtype", "auto"},
      {"mamba_cache_mode", "none"},
      {"enable_mamba_shared_prefix_checkpoint", "False"},
      {"replayssm_buffer_len", "16"},
      {"use_replayssm", "False"},
      {"use_kda_recoverssm", "False"},
      {"num_gpu_blocks", std::to_string(kv.blocks)},
      {"num_cpu_blocks", none},
      {"simple_cpu_offload_num_blocks", none},
      {"effective_attention_block_size", block},
      {"kv_cache_size_tokens", std::to_string(kv.tokens)},
      {"kv_cache_max_concurrency", concurrency},
      {"hash_block_size", block},
      {"cache_hit_alignment_tokens", block},
      {"kv_sharing_fast_prefill", "False"},
      {"swa_bounded_replay", "True"},
      {"kv_cache_memory_bytes", kv.kv_memory ? std::to_string(kv.kv_memory) : none},
      {"enable_extensible_kv_cache", none},
      {"kv_offloading_size", none},
      {"kv_offloading_backend", "native"},
      {"_block_size_resolved", "True"},
      {"_extensible_kv_cache_resolved", "False"},
      {"engine", "0"},
  };
}

}  // namespace qs
