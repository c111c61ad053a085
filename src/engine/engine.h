#pragma once
// The serving engine: continuous batching over one model. Requests join the running batch at any step and leave
// when they finish; prompts are prefilled in chunks so a long prompt never freezes running streams; each decode
// step sends every running sequence through one pass over the weights. Nothing is compiled or specialised per
// prompt length or max_tokens: the first request of any shape runs at full speed.
//
// KV memory: every sequence's K/V live in blocks of one shared pool (model/kv_cache.h), sized from a byte budget.
// A request is admitted only when the pool has blocks for its whole prompt and a block to decode into; it first
// adopts whatever complete blocks of its prompt the prefix cache still holds. When a step needs more blocks than
// are left, the youngest running sequence is preempted: its blocks go back and it is queued first, to recompute
// its prompt and what it generated so far (its sampler, stop strings and streamed text carry on untouched). Every
// admitted sequence fits the pool alone (longer ones are refused at submit), so the oldest always progresses.
//
// Threading: submit()/cancel()/stats()/drain() may be called from any thread. Events are delivered on the engine's
// own thread; a sink must return quickly (hand the event to the HTTP thread) and returns false when its client is
// gone, which cancels the request and frees its slot at the next step.
//
// Speculative decoding (engine/speculative.h), per request or by default: a decoding sequence with a drafter sends
// its last token and a draft through the same batched step, and the sampler keeps the draft's tokens as long as
// they are what it would have picked; the output is exactly what decoding without speculation gives (greedy: the
// same tokens; sampling: the same distribution), with every stop rule applied token by token.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "constrain/constraint_spec.h"
#include "engine/engine_stats.h"
#include "engine/generation_config.h"
#include "engine/media_prompt.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "model/kv_events.h"

namespace qs {

class Gemma4Assistant;
class Gemma4Model;
class LoraAdapter;
class Tokenizer;

struct EngineOptions {
  int max_running = 16;         // sequences decoded together
  int max_waiting = 64;         // bounded queue: past it submit() answers QueueFull (HTTP 429)
  int64_t prefill_chunk = 256;  // prompt tokens of one request per step
  int64_t max_context = 0;      // positions per sequence; 0 = the model's max_position_embeddings (at most what the
                                // KV pool holds for one sequence)
  uint64_t kv_bytes = 0;        // KV pool budget; 0 = room for max_running sequences of max_context
  int64_t kv_block_size = 16;   // positions per KV block
  uint64_t media_cache_bytes = 0;  // soft tokens of encoded media kept for reuse (media_cache.h); 0 = none
  // The prefix cache's disk tier (kv_disk_tier.h), when set; its identity is the model's, to which the engine adds
  // the activations' precision, the KV dtype and the block size.
  std::optional<DiskTierOptions> prefix_disk;
  SpeculativeConfig speculative;  // for requests that do not choose; method None = no speculation by default
  // KV room per sequence for draft tokens (sliding-window layers keep that many positions more): a request's
  // num_speculative_tokens is capped to it, and with 0 (and no default) no request may speculate.
  int64_t max_draft_tokens = 0;
  const Gemma4Model* draft_model = nullptr;  // for SpeculativeMethod::DraftModel (same vocabulary as the model)
  // For SpeculativeMethod::Assistant (loaded for the model): the sliding-window layers keep its sliding_kept().
  const Gemma4Assistant* assistant = nullptr;
  // KV events (model/kv_events.h), when set: each engine step's events, handed over as one batch on the engine
  // thread (the sink must not block), block hashes seeded as vLLM's NONE_HASH from kv_events_hash_seed.
  std::function<void(std::vector<KvEvent>)> kv_events;
  std::string kv_events_hash_seed = "vllm-none-hash";
  // Benchmarks only: wraps each speculating sequence's drafter (bench --draft-acceptance scripts its tokens).
  DrafterWrapper wrap_drafter;
};

struct EngineRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;        // stop strings, never emitted
  std::vector<int32_t> stop_token_ids;  // besides the generation config's eos ids
  bool ignore_eos = false;
  ConstraintSpec constraint;  // what the output must obey (src/constrain); None = free text
  // Event text leaves special tokens out, but for the chat template's markers when this is set (what the
  // tool-call and reasoning parser reads; text/tool_calls.h).
  bool keep_chat_markers = false;
  // Soft tokens (images, audio: engine/media_prompt.h) at runs of the prompt's placeholders, ascending. Prefill
  // never splits a span across chunks, and prefix-cache keys see their content (MediaSpan::key). A span given
  // prepared but not encoded is encoded on the engine thread when its sequence is admitted (the engine needs the
  // towers then), unless the prefix cache already holds every position of it.
  std::vector<MediaSpan> media;
  std::optional<SpeculativeConfig> speculative;  // unset: the engine's default
  // Prompt scoring (engine/prompt_scores.h) with this many alternatives per position; unset = none. Each prompt
  // token after the first is scored from the prefill's logits at the position before it, so such a request adopts
  // nothing from the prefix cache (as vLLM: adopted positions have no logits) but publishes its blocks as any
  // prefill does. It may have max_tokens 0: scored, never sampled (finish_reason "length").
  std::optional<int32_t> prompt_logprobs;
  // A LoRA adapter loaded against the engine's model (model/lora_adapter.h); null: the base model. Its id salts
  // the sequence's prefix-cache keys.
  std::shared_ptr<const LoraAdapter> lora;
};

struct EngineEvent {
  std::string text;                  // text that became final with this event (complete UTF-8)
  std::vector<SampledToken> tokens;  // tokens generated since the previous event
  // With EngineRequest::prompt_logprobs, on the request's first event only: prompt tokens 1..n-1 scored, in order
  // (the first token has nothing before it).
  std::vector<SampledToken> prompt_logprobs;
  bool finished = false;
  std::string finish_reason;         // when finished: "stop", "length", "abort" or "error"
  std::string error;                 // when finish_reason is "error"
  std::string stop_string;           // when a stop string ended generation: which one (Anthropic's stop_sequence)
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// Return false when the client is gone: the request is cancelled.
using EventSink = std::function<bool(EngineEvent&&)>;

enum class SubmitStatus { Accepted, QueueFull, Invalid, ShuttingDown };
struct SubmitResult {
  SubmitStatus status = SubmitStatus::Accepted;
  std::string error;  // for Invalid: names the parameter and the numbers (e.g. prompt longer than the context)
  uint64_t id = 0;
  bool constraint_error = false;  // for Invalid: the constraint is at fault (a schema keyword, a tool's parameters)
};

class Engine {
 public:
  // `towers` (may be null: then every media span must come encoded) must outlive the engine.
  Engine(const Gemma4Model& model, const Tokenizer* tokenizer, GenerationConfig generation, EngineOptions options,
         const MediaTowers* towers = nullptr);
  ~Engine();  // cancels whatever still runs and joins the engine thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  SubmitResult submit(EngineRequest request, EventSink sink);
  void cancel(uint64_t id);
  EngineStats stats() const;
  // From now on submit() answers ShuttingDown; what was accepted still runs (drain() begins with this).
  void stop_accepting();
  // Stops accepting, lets running and waiting requests finish for up to `grace`, then cancels the rest ("abort").
  void drain(std::chrono::milliseconds grace);

  const Gemma4Model& model() const { return model_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  const GenerationConfig& generation_config() const { return generation_; }
  int64_t max_context() const { return max_context_; }
  // Why max_context() is what it is: the --max-model-len given, the model's context, or all that the KV pool holds
  // (memory_plan.h, choose_max_model_len).
  const std::string& max_context_reason() const { return max_context_reason_; }
  std::string_view kv_dtype() const;  // "f32", "bf16" or "int8": how the KV pool stores K/V
  // With EngineOptions::kv_events: the vLLM hashes of the prefix blocks the cache held after the last step that
  // produced events, unordered (what a consumer of every batch published so far rebuilds).
  std::vector<uint64_t> kv_block_hashes() const;
  int64_t kv_block_size() const;
  int64_t kv_blocks_total() const;  // blocks of the class KV events report

 private:
  struct State;
  void loop();

  const Gemma4Model& model_;
  const Tokenizer* tokenizer_;
  const MediaTowers* towers_;
  GenerationConfig generation_;
  EngineOptions options_;
  int64_t max_context_ = 0;
  std::string max_context_reason_;
  std::unique_ptr<State> state_;
};

}  // namespace qs
