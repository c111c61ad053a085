#pragma once
// What `serve` loads behind its HTTP layer (http_server.h) and owns for its lifetime: the model with its drafters
// (--draft-model, --assistant) and LoRA adapters (--lora), the tokenizer, the media towers, the KV events publisher,
// the batching engine, and the ServedModel the protocol code reads them through. Apart from the server so that
// loading (the memory plan, the KV pool, the checks that name a flag) reads on its own; the routes only read it.
//
// Threads: load() and warm_up() run on the server's main thread while the I/O thread already answers /health and
// /metrics, so what those read before the model is ready (planned_resident_bytes) is atomic; the rest is read only
// once the server says it is ready.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/media_prompt.h"
#include "engine/memory_plan.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "server/kv_events_publisher.h"
#include "server/lora_registry.h"
#include "server/openai_protocol.h"
#include "server/serve_options.h"
#include "server/server_log.h"
#include "text/tokenizer.h"

namespace qs {

class ServingStack {
 public:
  // `model_name`: the id the model is served as (/v1/models); `log` outlives the stack.
  ServingStack(const ServeOptions& options, const std::string& model_name, ServerLog& log);

  // Loads everything and starts the engine; logs "loaded" and "kv_pool". Throws qs::Error naming the flag at fault.
  void load();
  // Readiness means the model has really run: one 1-token request through the engine. Returns early (not ready)
  // when interrupted; throws when the engine refuses or fails it.
  void warm_up();
  // Ends the engine: after the server has drained it and closed every connection whose source reads it.
  void stop_engine() { engine_.reset(); }

  bool loaded() const { return engine_ != nullptr; }
  const ServeOptions& options() const { return o_; }
  Gemma4Model& model() const { return *model_; }
  Engine& engine() const { return *engine_; }
  Engine* engine_if_loaded() const { return engine_.get(); }
  KvEventsPublisher* kv_events() const { return kv_events_.get(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ServedModel& served() const { return served_; }
  LoraRegistry& loras() { return loras_; }
  const LoraRegistry& loras() const { return loras_; }
  const nlohmann::ordered_json& tokenizer_info() const { return tokenizer_info_; }  // GET /tokenizer_info
  // The plan's cpu resident memory with this KV pool; 0 until loaded.
  uint64_t planned_resident_bytes() const { return planned_resident_.load(); }
  // What a request may carry: "text", and "image" / "audio" when the checkpoint has that tower.
  std::vector<std::string> modalities() const;

 private:
  void load_draft_model();
  void load_loras();
  EngineOptions engine_options() const;
  void start_engine(const GenerationConfig& generation, const EngineOptions& eo, const MemoryPlan& plan);
  void describe_served_model(const GenerationConfig& generation, int image_soft_tokens, int max_image_soft_tokens);
  void log_loaded(const MemoryPlan& plan, double load_s) const;

  const ServeOptions& o_;
  std::string model_name_;
  ServerLog& log_;
  std::atomic<uint64_t> planned_resident_{0};
  std::unique_ptr<Gemma4Model> model_;
  std::unique_ptr<Gemma4Model> draft_model_;    // --draft-model, for speculative decoding
  std::unique_ptr<Gemma4Assistant> assistant_;  // --assistant, for speculative decoding
  std::optional<Tokenizer> tokenizer_;
  std::optional<MediaTowers> towers_;  // the checkpoint's vision and audio towers (none, either or both)
  std::unique_ptr<KvEventsPublisher> kv_events_;  // --kv-events-endpoint; outlives the engine, which feeds it
  std::unique_ptr<Engine> engine_;
  ServedModel served_;
  nlohmann::ordered_json tokenizer_info_;
  LoraRegistry loras_;  // the adapters a request's model may name
};

}  // namespace qs
