#include "server/serving_stack.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <future>

#include "engine/checkpoint_identity.h"
#include "engine/generation_config.h"
#include "engine/memory_plan.h"
#include "model/lora_adapter.h"
#include "server/image_budget.h"
#include "server/serve_plan.h"
#include "server/tokenizer_info.h"
#include "text/chat_template.h"
#include "util/error.h"
#include "util/interrupt.h"
#include "util/parallel.h"

namespace qs {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

ServingStack::ServingStack(const ServeOptions& options, const std::string& model_name, ServerLog& log)
    : o_(options), model_name_(model_name), log_(log), loras_(model_name, options.max_loras, options.max_lora_rank) {}

void ServingStack::load() {
  const auto t0 = Clock::now();
  // The progress line is for people; a JSON log stays one object per line (the "loaded" event has the time).
  model_ = Gemma4Model::load(o_.model_dir, parse_precision(o_.precision), log_.format() == LogFormat::Text);
  if (!o_.kv_dtype.empty()) model_->set_kv_dtype(parse_kv_dtype(o_.kv_dtype));
  const auto tokenizer_path = o_.model_dir / "tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path))
    throw Error(fmt::format("{}: no tokenizer.json, which serve needs", o_.model_dir.string()));
  tokenizer_ = Tokenizer::load(tokenizer_path);
  const GenerationConfig generation = read_generation_config(o_.model_dir);
  load_draft_model();
  load_loras();
  EngineOptions eo = engine_options();
  const bool vision = model_->config().has_vision || model_->config().unified_vision.has_value();
  const ImageBudgets images = resolve_image_budgets(
      o_.image_soft_tokens, o_.max_image_soft_tokens,
      vision ? media::read_image_processor_options(o_.model_dir).max_soft_tokens : 0);
  const MemoryPlan plan = serve_plan(*model_, eo, images.max, loras_.planned_bytes(*model_, o_.lora_runtime_loading));
  eo.kv_bytes = o_.kv_memory ? o_.kv_memory : planned_kv_bytes(plan, *model_, eo);
  eo.media_cache_bytes = o_.media_cache_bytes;
  if (!o_.prefix_cache_dir.empty())
    eo.prefix_disk = DiskTierOptions{o_.prefix_cache_dir, o_.prefix_cache_disk_bytes,
                                     checkpoint_identity(model_->checkpoint()), /*adapter=*/0,
                                     [this](const std::string& line) { log_.write("prefix_cache", line, nullptr, "warning"); }};
  towers_ = MediaTowers::load(*model_, o_.model_dir);
  kv_events_ = connect_kv_events(eo, o_.kv_events, o_.kv_events_hash_seed);
  start_engine(generation, eo, plan);
  tokenizer_info_ = qs::tokenizer_info(o_.model_dir, engine_->max_context());
  describe_served_model(generation, images.fallback, images.max);
  planned_resident_ = plan.cpu_resident_without_kv() + engine_->stats().kv_bytes_total;
  log_loaded(plan, seconds_since(t0));
}

EngineOptions ServingStack::engine_options() const {
  EngineOptions eo;
  eo.max_running = o_.max_running;
  eo.max_waiting = o_.max_waiting;
  eo.max_context = checked_max_model_len(o_.max_model_len, model_->config().text);
  eo.speculative = o_.speculative;
  eo.max_draft_tokens = o_.speculative.num_speculative_tokens;  // per-request opt-in up to the default's count
  eo.draft_model = draft_model_.get();
  eo.assistant = assistant_.get();
  return eo;
}

// The engine over the KV pool the plan (or --kv-memory) sizes; a pool too small for --max-model-len is refused here,
// naming both flags, rather than serving a shorter context than asked.
void ServingStack::start_engine(const GenerationConfig& generation, const EngineOptions& eo, const MemoryPlan& plan) {
  try {
    engine_ = std::make_unique<Engine>(*model_, &*tokenizer_, generation, eo, &*towers_);
  } catch (const Error& e) {
    if (!o_.kv_memory) throw;
    throw Error(fmt::format("--kv-memory {}: {}", o_.kv_memory, e.what()));
  }
  if (o_.max_model_len > 0 && engine_->max_context() < o_.max_model_len)
    throw Error(fmt::format("--max-model-len {}: the KV pool ({} bytes, {}) holds only {} positions for one sequence; "
                            "give a larger --kv-memory or a smaller --max-model-len", o_.max_model_len,
                            engine_->stats().kv_bytes_total, o_.kv_memory ? "--kv-memory" : plan.device.note,
                            engine_->max_context()));
}

// What the protocol code (openai_protocol.h) reads of the model: its name, tokenizer, template, context and media.
void ServingStack::describe_served_model(const GenerationConfig& generation, int image_soft_tokens,
                                         int max_image_soft_tokens) {
  served_.name = model_name_;
  // With adapters, a name that is neither the base nor an adapter is a mistake to report, not the base to serve.
  served_.strict_name = !o_.served_model_name.empty() || !o_.loras.empty() || o_.lora_runtime_loading;
  served_.tool_call_grammar = o_.tool_call_grammar;
  served_.find_adapter = [this](const std::string& name) { return loras_.find(name); };
  served_.tokenizer = &*tokenizer_;
  served_.generation = generation;
  served_.dialect = gemma4_chat_dialect_for_checkpoint(o_.model_dir, model_->config().text);
  served_.max_context = engine_->max_context();
  served_.vocab_size = model_->config().text.vocab_size;
  served_.media.fetch = o_.media_fetch;
  served_.media.images = towers_->images();
  served_.media.audio = towers_->audio();
  served_.media.image_soft_tokens = image_soft_tokens;
  served_.media.max_image_soft_tokens = max_image_soft_tokens;
  if (towers_->images() || towers_->audio())
    served_.prepare_media = [this](std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs) {
      return prepare_media_prompt(tokens, inputs, *towers_, *tokenizer_);
    };
}

void ServingStack::log_loaded(const MemoryPlan& plan, double load_s) const {
  const EngineStats s = engine_->stats();
  log_.write("loaded",
             fmt::format("loaded {} ({} weights, {} activations, {} bytes of weights, context {}: {}, input {}) in "
                         "{:.2f} s", o_.model_dir.string(), model_->int4_weights() ? "int4" : "bf16",
                         precision_name(model_->precision()), model_->weight_bytes(), served_.max_context,
                         engine_->max_context_reason(), fmt::join(modalities(), "+"), load_s),
             {{"model_dir", o_.model_dir.string()}, {"weights", model_->int4_weights() ? "int4" : "bf16"},
              {"modalities", modalities()},
              {"activations", precision_name(model_->precision())}, {"weight_bytes", model_->weight_bytes()},
              {"max_model_len", served_.max_context}, {"max_model_len_reason", engine_->max_context_reason()},
              {"load_s", load_s},
              {"threads", ThreadPool::shared().size()}});
  const std::string kv_source =
      o_.kv_memory ? "--kv-memory" : fmt::format("from the memory plan of {} bytes: {}", plan.device.bytes, plan.device.note);
  log_.write("kv_pool",
             fmt::format("KV pool {} bytes ({}), {} blocks, {} KV, {} positions for the full-attention layers",
                         s.kv_bytes_total, kv_source, s.kv_blocks_total, engine_->kv_dtype(), s.kv_tokens_total),
             {{"kv_bytes", s.kv_bytes_total}, {"source", kv_source}, {"blocks", s.kv_blocks_total},
              {"kv_dtype", engine_->kv_dtype()}, {"positions", s.kv_tokens_total}});
}

// --draft-model and --assistant: loaded in the model's precision; the default speculative method checked (a draft
// model's vocabulary against the model's, an assistant's fit).
void ServingStack::load_draft_model() {
  const bool progress = log_.format() == LogFormat::Text;
  if (!o_.draft_model.empty()) draft_model_ = Gemma4Model::load(o_.draft_model, model_->precision(), progress);
  if (!o_.assistant.empty()) {
    assistant_ = Gemma4Assistant::load(o_.assistant, *model_, progress);
    log_.write("assistant", fmt::format("assistant drafter {} for speculative decoding", o_.assistant.string()),
               {{"assistant", o_.assistant.string()}});
  }
  make_drafter(o_.speculative, *model_, draft_model_.get(), 1, assistant_.get());  // the default works, or why not
  if (o_.draft_model.empty()) return;
  log_.write("draft_model", fmt::format("draft model {} for speculative decoding ({} bytes of weights)",
                                        o_.draft_model.string(), draft_model_->weight_bytes()),
             {{"draft_model", o_.draft_model.string()}, {"weight_bytes", draft_model_->weight_bytes()}});
}

// --lora NAME=DIR, each read and checked against the model (a bad one stops the server, naming it).
void ServingStack::load_loras() {
  if (static_cast<int>(o_.loras.size()) > o_.max_loras)
    throw Error(fmt::format("--lora names {} adapters but --max-loras is {}; give --max-loras {}", o_.loras.size(),
                            o_.max_loras, o_.loras.size()));
  for (const auto& [name, dir] : o_.loras) {
    try {
      loras_.load(name, dir, *model_);
    } catch (const ApiError& e) {
      throw Error(fmt::format("--lora {}={}: {}", name, dir.string(), e.what()));
    }
    const auto adapter = loras_.find(name);
    log_.write("lora", fmt::format("LoRA adapter {} from {}: {} linears, {} of the towers, {} expert "
                                   "parameters, rank up to {}, {} bytes",
                                   name, dir.string(), adapter->weights().size(), adapter->tower_weights().size(),
                                   adapter->expert_parameters(), adapter->max_rank(), adapter->bytes()),
               {{"lora_name", name}, {"lora_path", dir.string()}, {"bytes", adapter->bytes()}});
  }
}

void ServingStack::warm_up() {
  const auto t0 = Clock::now();
  EngineRequest r;
  r.prompt = {served_.generation.bos_token_id};
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  auto done = std::make_shared<std::promise<std::string>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  SubmitResult s = engine_->submit(r, [done, once](EngineEvent&& e) {
    if (e.finished && !once->exchange(true)) done->set_value(e.finish_reason == "error" ? e.error : "");
    return true;
  });
  if (s.status != SubmitStatus::Accepted) throw Error(fmt::format("warm-up request refused by the engine: {}", s.error));
  auto result = done->get_future();
  while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (interrupted()) {
      engine_->cancel(s.id);
      return;
    }
  }
  std::string error = result.get();
  if (!error.empty()) throw Error("warm-up request failed: " + error);
  const double warm_up_s = seconds_since(t0);
  log_.write("warm_up", fmt::format("warm-up forward pass in {:.3f} s", warm_up_s), {{"warm_up_s", warm_up_s}});
}

std::vector<std::string> ServingStack::modalities() const {
  std::vector<std::string> m = {"text"};
  if (served_.media.images) m.push_back("image");
  if (served_.media.audio) m.push_back("audio");
  return m;
}

}  // namespace qs
