#pragma once
// Block hashes as vLLM computes them for its prefix cache and its KV events (vllm/v1/core/kv_cache_utils.py,
// `--prefix-caching-hash-algo sha256_cbor`), so that a router computing them from a prompt's token ids (llm-d's
// KV-cache indexer) finds the blocks qatserve publishes (kv_events.h):
//   NONE_HASH      = sha256(cbor(seed)), seed a text string: PYTHONHASHSEED where vLLM has it set, else vLLM's
//                    fixed default "vllm-none-hash";
//   hash(block)    = sha256(cbor([parent hash or NONE_HASH, [token ids...], extra keys or null]))  (canonical CBOR);
//   the hash on the wire = its last 8 bytes as a big-endian integer (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
// Extra keys: a LoRA adapter's name as vLLM keys its blocks, (name,); none otherwise.
// sha256_cbor is the one choice: vLLM's other options (sha256 over pickle, xxhash, Python's builtin hash) are not
// reproducible outside a Python process of the same version, or use a per-process random seed.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace qs {

using VllmBlockHash = std::array<uint8_t, 32>;

// sha256(cbor(seed)): the parent hash of a sequence's first block.
VllmBlockHash vllm_none_hash(std::string_view seed);
// The seed vLLM derives NONE_HASH from: PYTHONHASHSEED if set, else "vllm-none-hash".
std::string vllm_default_hash_seed();
// One block's hash, chained over its parent's; `lora_name` empty: no extra keys.
VllmBlockHash vllm_block_hash(const VllmBlockHash& parent, std::span<const int32_t> tokens,
                              std::string_view lora_name = {});
// The integer form KV events carry: the low 64 bits of the digest read big-endian.
uint64_t vllm_external_hash(const VllmBlockHash& hash);

}  // namespace qs
