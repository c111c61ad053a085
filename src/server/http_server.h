#pragma once
// `qatserve serve`: the OpenAI-compatible HTTP server over the batching engine (http_transport.h: event-driven, Boost.Beast).
//
//   POST /v1/chat/completions, POST /v1/completions   streaming (SSE) or not; see openai_protocol.h
//   POST /v1/responses                                 OpenAI's Responses API on the chat path (openai_responses.h,
//                                                      responses_output.h); GET and DELETE /v1/responses/{id} and
//                                                      POST /v1/responses/{id}/cancel read the store
//                                                      (response_store.h)
//   POST /v1/messages, POST /v1/messages/count_tokens Anthropic's Messages API, streaming or not, and its error
//                                                      shape; see anthropic_messages_request.h and _response.h
//   POST /v1/audio/transcriptions                      OpenAI's speech-to-text upload (multipart/form-data) as a chat
//                                                      request of the clip, for models with an audio tower
//                                                      (audio_transcriptions.h)
//   GET  /                                             the chat page (chat_page.h), open even with an API key
//                                                      (it asks for the key); absent with --no-ui
//   GET  /v1/models                                    the model: --served-model-name, else its directory's name;
//                                                      once loaded, its context and the chat_template_kwargs it takes;
//                                                      then each LoRA adapter served (lora_admin.h)
//   GET  /props                                        llama.cpp server's: model_alias, model_path, total_slots,
//                                                      and once loaded default_generation_settings.n_ctx and
//                                                      modalities {vision, audio}
//   POST /tokenize, POST /detokenize                   the tokenizer as the server uses it
//   GET  /health                                       503 {"status":"loading"} until a warm-up request has run
//                                                      through the model, then 200 with backend, precision and
//                                                      modalities; always open, even with an API key
//   GET  /metrics                                      Prometheus text (metrics.h)
//   POST /v1/load_lora_adapter, /v1/unload_lora_adapter  vLLM's runtime LoRA API (lora_admin.h), with
//                                                      --enable-lora-runtime-loading only (else 404)
//
// Lifecycle: the server listens before the model loads (so /health can say "loading"), loads the model and the
// tokenizer, starts the engine and runs one 1-token request through it, then reports ready. SIGINT/SIGTERM close
// the listener and the connections waiting for a request, let the engine finish running requests for up to the
// grace period (streams included), abort the rest, and return 0. A client that closes its connection aborts its
// request (streaming or not) at once. Each generation request logs one line on stderr (server_log.h: text or JSON lines).
//
// Threads: the HTTP I/O thread only reads and writes (http_transport.h); a generation request's body is parsed,
// templated and tokenized and its media decoded and preprocessed on a PrepareQueue worker, which submits it to the
// engine (so every refusal, a corrupt image included, is a clean 400 before any response byte, streaming or not);
// the vision and audio towers run on the engine thread when the request is admitted, between steps, and reuse the
// soft tokens of media seen before (--media-cache-mb).
#include <chrono>
#include <cstddef>
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

// Runs until SIGINT or SIGTERM (util/interrupt.h must be installed), then drains; returns the exit status.
// Throws qs::Error when it cannot listen or the model cannot be loaded.
int run_server(const ServeOptions& options);

}  // namespace qs
