#pragma once
// What `qatserve serve` is told by its flags (src/cli/serve.cc), apart from the server (http_server.h) so that the
// pieces the server is built from (serving_stack.h, info_routes.h) read the options without the server.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "media/media_fetch.h"
#include "engine/speculative.h"
#include "server/kv_events_publisher.h"

namespace qs {

struct ServeOptions {
  std::filesystem::path model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;              // empty: no authentication
  bool ui = true;                   // GET / serves the chat page
  bool tool_call_grammar = true;    // tool_choice auto: calls the model opens are held to the tools
  std::string served_model_name;    // empty: the model directory's name, and requests may name any model
  int64_t max_model_len = 0;        // context cap per sequence; 0 = the model's (at most what the KV pool holds)
  unsigned threads = 0;             // compute threads (util/parallel.h); 0 = one per core
  std::string log_format = "text";  // text | json
  int max_running = 16;             // engine: sequences decoded together
  int max_waiting = 64;             // engine: queue bound; past it, 429
  std::string precision = "bf16";   // activations: bf16 | f32
  std::string kv_dtype;             // KV cache: f32 | bf16 | int8; empty: the precision's (kv_cache.h)
  uint64_t kv_memory = 0;           // KV pool bytes; 0 = from the memory plan of this machine (memory_plan.h)
  std::filesystem::path prefix_cache_dir;  // the prefix cache's disk tier (kv_disk_tier.h); empty = none
  uint64_t prefix_cache_disk_bytes = 8ull << 30;  // its bound, per model identity
  size_t max_body_bytes = 8u << 20;  // larger bodies: 413
  std::chrono::milliseconds drain_grace{10000};  // SIGINT/SIGTERM: how long running requests may take to finish
  std::chrono::milliseconds header_timeout{10000};  // a request's header (or an idle keep-alive): then closed
  std::chrono::milliseconds body_timeout{30000};    // a request's body, after its header: then closed
  int max_connections = 4096;                       // past it: 503 and closed
  media::MediaFetchOptions media_fetch;             // http(s) image URLs: refused unless hosts are allowed
  uint64_t media_cache_bytes = 64ull << 20;         // soft tokens of encoded images and clips kept for reuse; 0 = off
  int image_soft_tokens = 0;      // an image's budget when the request names none; 0 = processor_config.json's
  int max_image_soft_tokens = 0;  // the largest a request may ask (the plan reserves for it); 0 = the default's
  size_t responses_max_entries = 1000;              // POST /v1/responses kept for previous_response_id (LRU)
  size_t responses_max_bytes = 64u << 20;           // and their JSON text at most; 0 entries = none kept
  SpeculativeConfig speculative;       // the default for requests without a "speculative" field
  std::filesystem::path draft_model;   // --draft-model: a smaller Gemma 4 of the same vocabulary (method draft_model)
  std::filesystem::path assistant;     // --assistant: a Gemma 4 assistant drafter of the model (method assistant)
  // LoRA adapters (lora_registry.h): --lora NAME=DIR, served when a request's model is NAME.
  std::vector<std::pair<std::string, std::filesystem::path>> loras;
  int max_loras = 1;                 // adapters loaded at once (vLLM's default)
  int64_t max_lora_rank = 16;        // the largest rank an adapter may have (vLLM's default)
  bool lora_runtime_loading = false;  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter answer
  KvEventsOptions kv_events;           // --kv-events-endpoint...: none when its endpoint is empty
  std::string kv_events_hash_seed = vllm_default_hash_seed();  // vLLM's NONE_HASH seed (model/kv_block_hash.h)
};

// The API key serve requires: --api-key (visible to every user of the machine through `ps`), else the first line of
// --api-key-file (a mounted secret), else $QATSERVE_API_KEY (`env`, null when unset); empty: none. A key file that
// cannot be read, is empty or holds more than one line throws naming it.
std::string resolve_api_key(const std::string& flag_key, const std::filesystem::path& key_file, const char* env);

}  // namespace qs
