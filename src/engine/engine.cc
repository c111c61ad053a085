#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/media_cache.h"
#include "engine/media_spans.h"
#include "engine/memory_plan.h"
#include "engine/output_constraint.h"
#include "engine/prompt_scores.h"
#include "engine/stop_strings.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "engine/lora_loads.h"
#include "model/lora_adapter.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {
namespace {

// One request from submission to its last event.
struct Sequence {
  Sequence(EngineRequest r, EventSink s, const Tokenizer* tokenizer)
      : sampler(r.sampling), stops(r.stop), request(std::move(r)), sink(std::move(s)), tokens(request.prompt) {
    if (tokenizer)
      decoder.emplace(*tokenizer, /*skip_special_tokens=*/true,
                      request.keep_chat_markers ? gemma4_chat_markers() : std::span<const std::string_view>{});
  }
  uint64_t id = 0;
  Sampler sampler;  // validates the sampling parameters
  StopStringMatcher stops;
  EngineRequest request;
  EventSink sink;
  std::optional<StreamDecoder> decoder;
  std::vector<int32_t> tokens;   // the model's input: the prompt, then every generated token
  std::vector<int32_t> output;   // generated tokens
  std::optional<KvCache> cache;  // while admitted; dropped when preempted
  bool cancelled = false;
  OutputConstraint constraint;  // none unless the request asks for one
  // Speculative decoding (engine/speculative.h): none without a drafter.
  std::unique_ptr<Drafter> drafter;
  std::optional<Sampler> draft_sampler;  // the request's parameters, its own draws
  int64_t num_speculative_tokens = 0;
  Draft draft;                        // this step's, empty when it does not verify one
  std::vector<int32_t> step_tokens;   // this step's input when it verifies a draft: the last token, then the draft
  std::vector<float> target_hidden;   // for an assistant drafter: the final hidden state that gave the last token
  // Prompt scoring: prompt_scores[p] scores prompt token p + 1, filled as prefill chunks come back (again, the same,
  // if a preempted sequence recomputes them); sent with the first event once the whole prompt is scored.
  std::vector<SampledToken> prompt_scores;
  bool prompt_scored = false, prompt_scores_sent = false;

  bool scores_prompt() const { return request.prompt_logprobs && !prompt_scored; }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - cache->length(); }  // not yet in the cache
};

// The sequence's constraint, which ends its output at the request's stop ids and (unless ignored) EOS.
void start_constraint(Sequence& seq, ConstraintCompiler& compiler, const Tokenizer* tokenizer, int64_t vocab,
                      const GenerationConfig& generation) {
  std::vector<int32_t> end_ids = seq.request.stop_token_ids;
  if (!seq.request.ignore_eos) end_ids.insert(end_ids.end(), generation.eos_token_ids.begin(), generation.eos_token_ids.end());
  seq.constraint = compiler.start(seq.request.constraint, tokenizer, vocab, std::move(end_ids));
}

// The drafter's sampling parameters: the request's, with a seed of their own (its draws never shift the request's).
SamplingParams draft_sampling(SamplingParams p) {
  if (p.seed) p.seed = *p.seed ^ 0xd5a7f0e1c2b3a495ull;
  p.logprobs = false;
  p.top_logprobs = 0;
  return p;
}

void start_speculation(Sequence& seq, SpeculativeConfig config, const Gemma4Model& model,
                       const EngineOptions& options, int64_t max_context, int64_t max_draft) {
  if (!config.enabled()) return;
  if (max_draft < 1)
    throw Error("speculative: this engine keeps no KV room for draft tokens (serve --num-speculative-tokens)");
  config.num_speculative_tokens = std::min(config.num_speculative_tokens, max_draft);
  seq.drafter = make_drafter(config, model, options.draft_model, max_context, options.assistant);
  if (options.wrap_drafter) seq.drafter = options.wrap_drafter(std::move(seq.drafter));
  seq.draft_sampler.emplace(draft_sampling(seq.request.sampling));
  seq.num_speculative_tokens = config.num_speculative_tokens;
}

// Positions the pool holds for the layers whose KV grows with the context.
int64_t positions_budgeted(const KvPool& pool) {
  const KvClass c = pool.layout().layers[size_t(KvClass::Full)] ? KvClass::Full : KvClass::Sliding;
  return pool.blocks_total(c) * pool.layout().block_size;
}

}  // namespace

struct Engine::State {
  explicit State(uint64_t media_cache_bytes) : media_cache(media_cache_bytes) {}
  mutable std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // touched by the engine thread only
  std::vector<uint64_t> cancelled;
  uint64_t next_id = 1;
  bool accepting = true, stopping = false;
  int running_count = 0;
  EngineStats stats;
  LoraLoadBook lora_loads;  // its running counts set after admission and after each step
  std::shared_ptr<KvPool> pool;  // used by the engine thread only, once it runs
  std::shared_ptr<KvEventLog> kv_events;  // with EngineOptions::kv_events: the pool's, engine thread only
  std::vector<uint64_t> kv_block_hashes;  // the pool's reported hashes after the last batch of events
  std::string context_limit;     // why max_context is below what was asked, for refusals
  ConstraintCompiler constraints;
  MediaEmbeddingCache media_cache;  // engine thread only
  std::thread thread;
};

Engine::Engine(const Gemma4Model& model, const Tokenizer* tokenizer, GenerationConfig generation,
               EngineOptions options, const MediaTowers* towers)
    : model_(model), tokenizer_(tokenizer), towers_(towers), generation_(std::move(generation)), options_(options),
      state_(std::make_unique<State>(options.media_cache_bytes)) {
  const auto& text = model_.config().text;
  const int64_t wanted = options_.max_context > 0 ? options_.max_context : text.max_position_embeddings_or(8192);
  KvLayout layout =
      model_.kv_layout(options_.kv_block_size, options_.assistant ? options_.assistant->sliding_kept() : 0);
  layout.max_tentative = std::max(options_.max_draft_tokens,
                                  options_.speculative.enabled() ? options_.speculative.num_speculative_tokens : 0);
  const KvPoolSize size = options_.kv_bytes ? kv_pool_for_budget(layout, options_.kv_bytes, options_.max_running, wanted)
                                            : kv_pool_for_sequences(layout, options_.max_running, wanted);
  auto& pool = state_->pool = std::make_shared<KvPool>(layout, size);
  if (options_.prefix_disk) {
    DiskTierOptions disk = *options_.prefix_disk;
    disk.identity = hash_text(fmt::format("{} {} {} {}", disk.identity, precision_name(model_.precision()),
                                          kv_dtype_name(layout.dtype), layout.block_size));
    pool->attach_disk(std::make_unique<KvDiskTier>(std::move(disk)));
    state_->stats.prefix_disk = true;
  }
  if (options_.kv_events) {
    state_->kv_events = std::make_shared<KvEventLog>(layout.block_size, options_.kv_events_hash_seed);
    pool->attach_events(state_->kv_events);
    options_.kv_events(state_->kv_events->take());  // AllBlocksCleared: this process starts empty
  }
  max_context_ = std::min(wanted, pool->max_positions());
  if (options_.max_context > 0) {
    max_context_reason_ = fmt::format("--max-model-len {}", options_.max_context);
  } else if (options_.kv_bytes) {  // chosen from memory: the same pool, and a clear error when it holds no block
    const ContextChoice choice = choose_max_model_len(text, layout, options_.kv_bytes, options_.max_running);
    max_context_reason_ = choice.reason;
  } else {
    max_context_reason_ = fmt::format("{} tokens, the model's context; the KV pool sized for {} of them",
                                      max_context_, options_.max_running);
  }
  if (max_context_ < 1)
    throw Error(fmt::format("a KV pool of {} bytes holds no block: a block of {} positions takes {} bytes for the "
                            "full-attention layers and {} for the sliding-window layers",
                            options_.kv_bytes, layout.block_size, layout.block_bytes(KvClass::Full),
                            layout.block_bytes(KvClass::Sliding)));
  if (max_context_ < wanted)
    state_->context_limit = fmt::format(" (all that the KV pool holds for one sequence: {} bytes in blocks of {} "
                                        "positions)", pool->bytes(), layout.block_size);
  state_->stats.kv_tokens_total = positions_budgeted(*pool);
  state_->stats.kv_bytes_total = pool->bytes();
  state_->stats.kv_blocks_total = pool->blocks_total();
  state_->thread = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
    state_->accepting = false;
  }
  state_->wake.notify_all();
  state_->thread.join();
}

SubmitResult Engine::submit(EngineRequest request, EventSink sink) {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  auto invalid = [](std::string why) { return SubmitResult{SubmitStatus::Invalid, std::move(why)}; };
  if (prompt == 0) return invalid("prompt: at least one token is required");
  const int64_t min_tokens = request.prompt_logprobs ? 0 : 1;  // scoring alone generates nothing
  if (request.max_tokens < min_tokens)
    return invalid(fmt::format("max_tokens must be at least {}, got {}", min_tokens, request.max_tokens));
  if (request.prompt_logprobs && (*request.prompt_logprobs < 0 || *request.prompt_logprobs > kMaxTopLogprobs))
    return invalid(fmt::format("prompt_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, *request.prompt_logprobs));
  if (prompt + request.max_tokens > max_context_)
    return invalid(fmt::format("the prompt has {} tokens and max_tokens is {}: {} positions, but the context holds {}{}",
                               prompt, request.max_tokens, prompt + request.max_tokens, max_context_,
                               state_->context_limit));
  if (!request.stop.empty() && !tokenizer_) return invalid("stop: stop strings need the checkpoint's tokenizer");
  const int64_t vocab = model_.config().text.vocab_size;
  for (int32_t id : request.prompt)
    if (id < 0 || id >= vocab) return invalid(fmt::format("prompt: token id {} is outside the vocabulary (0..{})", id, vocab - 1));
  const Gemma4TextConfig& text = model_.config().text;
  if (auto why = check_media(request, text.hidden_size, towers_)) return invalid(*why);
  std::unique_ptr<Sequence> seq;
  try {
    seq = std::make_unique<Sequence>(std::move(request), std::move(sink), tokenizer_);
    start_speculation(*seq, seq->request.speculative.value_or(options_.speculative), model_, options_, max_context_, state_->pool->layout().max_tentative);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  key_media_positions(seq->request.media, seq->tokens, text.has_ple() ? std::min(vocab, text.vocab_size_per_layer_input) : vocab);
  try {
    if (seq->request.constraint.active())
      start_constraint(*seq, state_->constraints, tokenizer_, model_.config().text.vocab_size, generation_);
  } catch (const Error& e) {
    SubmitResult r = invalid(e.what());
    r.constraint_error = true;
    return r;
  }
  std::lock_guard lock(state_->mu);
  if (!state_->accepting) return {SubmitStatus::ShuttingDown, "the server is shutting down"};
  if (static_cast<int>(state_->waiting.size()) >= options_.max_waiting &&
      state_->running_count >= options_.max_running)
    return {SubmitStatus::QueueFull, fmt::format("{} requests are running and {} waiting", state_->running_count,
                                                 state_->waiting.size())};
  seq->id = state_->next_id++;
  uint64_t id = seq->id;
  state_->lora_loads.accepted(seq->request.lora.get());
  state_->waiting.push_back(std::move(seq));
  state_->wake.notify_all();
  return {SubmitStatus::Accepted, "", id};
}

void Engine::cancel(uint64_t id) {
  std::lock_guard lock(state_->mu);
  state_->cancelled.push_back(id);
  state_->wake.notify_all();
}

std::vector<uint64_t> Engine::kv_block_hashes() const {
  std::lock_guard lock(state_->mu);
  return state_->kv_block_hashes;
}

int64_t Engine::kv_block_size() const { return state_->pool->layout().block_size; }

int64_t Engine::kv_blocks_total() const {
  return state_->pool->blocks_total(state_->pool->reported_class());
}

std::string_view Engine::kv_dtype() const { return kv_dtype_name(state_->pool->layout().dtype); }

EngineStats Engine::stats() const {
  std::lock_guard lock(state_->mu);
  EngineStats s = state_->stats;
  s.waiting = static_cast<int>(state_->waiting.size());
  s.running = state_->running_count;
  s.lora_loads = state_->lora_loads.loads(state_->waiting);
  return s;
}

void Engine::stop_accepting() {
  std::lock_guard lock(state_->mu);
  state_->accepting = false;
}

void Engine::drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(state_->mu);
  state_->accepting = false;
  state_->idle.wait_for(lock, grace, [&] { return state_->waiting.empty() && state_->running_count == 0; });
  state_->stopping = true;  // whatever still runs is aborted by the loop
  state_->wake.notify_all();
}

namespace {

// Delivers an event; a sink that reports its client gone cancels the sequence.
void deliver(Sequence& seq, EngineEvent&& event) {
  if (seq.prompt_scored && !seq.prompt_scores_sent) {
    event.prompt_logprobs = std::move(seq.prompt_scores);
    seq.prompt_scores_sent = true;
  }
  event.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
  event.completion_tokens = static_cast<int64_t>(seq.output.size());
  if (!seq.sink(std::move(event))) seq.cancelled = true;
}

// The last event: text still held by the decoder or the stop matcher is released (a stop string completed by
// that tail turns the reason into "stop"), then the sequence leaves the batch.
void finish(Sequence& seq, std::string reason, std::string error = "", EngineEvent e = {}) {
  if (seq.decoder && reason != "abort" && reason != "error" && !seq.stops.stopped()) {
    StopScan tail = seq.stops.push(seq.decoder->flush());
    e.text += tail.text;
    if (tail.stopped_by) reason = "stop";
    else e.text += seq.stops.finish();
  }
  e.finished = true;
  e.finish_reason = std::move(reason);
  e.error = std::move(error);
  if (auto stop = seq.stops.stopped_by()) e.stop_string = seq.request.stop[*stop];
  deliver(seq, std::move(e));
  seq.cancelled = true;  // done: leaves the batch
}

// Streams a chosen token, and finishes the sequence on a stop or at max_tokens. False when the sequence is done.
bool take_token(Sequence& seq, SampledToken token, const GenerationConfig& generation) {
  const auto& stop_ids = seq.request.stop_token_ids;
  if (std::find(stop_ids.begin(), stop_ids.end(), token.id) != stop_ids.end() ||
      (!seq.request.ignore_eos && generation.is_eos(token.id))) {
    finish(seq, "stop");
    return false;
  }
  const bool grammar_done = seq.constraint.advance(token.id);
  seq.output.push_back(token.id);
  seq.tokens.push_back(token.id);
  EngineEvent e;
  e.tokens.push_back(token);
  bool stopped = false;
  if (seq.decoder) {
    StopScan scan = seq.stops.push(seq.decoder->push(token.id));
    e.text = std::move(scan.text);
    stopped = scan.stopped_by.has_value();
  }
  const bool length = static_cast<int64_t>(seq.output.size()) >= seq.request.max_tokens;
  if (stopped || grammar_done || length) {
    finish(seq, stopped || grammar_done ? "stop" : "length", "", std::move(e));
    return false;
  }
  deliver(seq, std::move(e));
  return !seq.cancelled;
}

// Samples the token after `logits` and takes it.
void sample_next(Sequence& seq, std::span<const float> logits, const GenerationConfig& generation) {
  take_token(seq, seq.sampler.sample(logits, seq.request.prompt, seq.output, seq.constraint.mask()), generation);
}

// Asks the drafter for this step's draft: as many tokens as the request may still output besides the one the
// step always gives, and the context holds.
void prepare_draft(Sequence& seq, int64_t max_context) {
  seq.draft = {};
  if (!seq.drafter || seq.pending() != 1) return;
  const int64_t left = seq.request.max_tokens - static_cast<int64_t>(seq.output.size()) - 1;
  const int64_t n = std::min({seq.num_speculative_tokens, left, max_context - seq.cache->length() - 1});
  if (n < 1) return;
  DraftContext ctx{seq.tokens, static_cast<int64_t>(seq.request.prompt.size()), n, &*seq.draft_sampler,
                   seq.target_hidden, &*seq.cache};
  seq.draft = seq.drafter->propose(ctx);
  if (static_cast<int64_t>(seq.draft.tokens.size()) > n) seq.draft.tokens.resize(n);
  seq.step_tokens.assign(1, seq.tokens.back());
  seq.step_tokens.insert(seq.step_tokens.end(), seq.draft.tokens.begin(), seq.draft.tokens.end());
}

// The logits of the last token and of each draft token, row by row: each row gives the token the sampler picks
// there (Sampler::verify), taken as usual (stops, max_tokens, the grammar), until one differs from the draft. The
// cache keeps the positions of the tokens taken. Returns the draft tokens accepted.
int64_t verify_draft(Sequence& seq, std::span<const float> logits, int64_t vocab, const GenerationConfig& generation) {
  static const TokenDistribution kPointMass;
  const Draft& draft = seq.draft;
  const int64_t n = static_cast<int64_t>(draft.tokens.size()), before = seq.cache->length() - n;
  int64_t accepted = 0;
  for (int64_t i = 0; i <= n; ++i) {
    const auto row = logits.subspan(i * vocab, vocab);
    SampledToken token =
        i < n ? seq.sampler.verify(row, seq.request.prompt, seq.output, seq.constraint.mask(), draft.tokens[i],
                                   draft.distributions.empty() ? kPointMass : draft.distributions[i])
              : seq.sampler.sample(row, seq.request.prompt, seq.output, seq.constraint.mask());
    const bool agrees = i < n && token.id == draft.tokens[i];
    accepted += agrees;
    if (!take_token(seq, std::move(token), generation) || !agrees) break;
  }
  if (seq.cancelled) return accepted;
  seq.cache->truncate(before + accepted);
  if (!seq.target_hidden.empty()) {  // keep the row that gave the last token
    const size_t hidden = seq.target_hidden.size() / (n + 1);
    seq.target_hidden.erase(seq.target_hidden.begin(), seq.target_hidden.begin() + accepted * hidden);
    seq.target_hidden.resize(hidden);
  }
  return accepted;
}

// Scores the prompt tokens after positions [start, start + rows) from those positions' logits; the prompt is
// scored once a step has reached its last position.
void score_prompt_rows(Sequence& seq, std::span<const float> logits, int64_t start, int64_t rows, int64_t vocab) {
  const std::vector<int32_t>& prompt = seq.request.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  seq.prompt_scores.resize(n - 1);
  const int64_t scored = std::clamp<int64_t>(n - 1 - start, 0, rows);
  // Rows are independent: spread over the compute pool (a 262k vocabulary costs a pass of exp per row).
  ThreadPool::shared().parallel_for(scored, 8, [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j)
      seq.prompt_scores[start + j] =
          score_token(logits.subspan(j * vocab, vocab), prompt[start + j + 1], *seq.request.prompt_logprobs);
  });
  if (start + rows >= n) seq.prompt_scored = true;
}

// One more at each of the positions 0..n-1.
void count_positions(std::vector<uint64_t>& counts, int64_t n) {
  if (static_cast<int64_t>(counts.size()) < n) counts.resize(n);
  for (int64_t i = 0; i < n; ++i) ++counts[i];
}

void add_counts(std::vector<uint64_t>& into, const std::vector<uint64_t>& counts) {
  if (into.size() < counts.size()) into.resize(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) into[i] += counts[i];
}

// Admits `seq` when, after adopting what the prefix cache holds of its tokens, the pool has blocks for the rest
// and one more block to decode into.
bool admit(Sequence& seq, const std::shared_ptr<KvPool>& pool, int64_t max_context, EngineStats& stats) {
  seq.cache.emplace(pool, max_context);
  if (seq.request.lora) seq.cache->set_prefix_salt(seq.request.lora->id(), seq.request.lora->name());
  const bool looks_up = !seq.scores_prompt();  // scoring needs every position's logits: nothing to adopt
  const int64_t adopted = looks_up ? seq.cache->adopt_prefix(seq.tokens) : 0;
  const int64_t room = std::min(seq.pending() + pool->layout().block_size, max_context - seq.cache->length());
  if (!pool->has_blocks(seq.cache->blocks_to_append(room))) {
    seq.cache.reset();
    return false;
  }
  stats.prefix_hit_tokens += adopted;
  stats.prefix_disk_hit_tokens += seq.cache->adopted_from_disk();
  if (looks_up) stats.prefix_query_tokens += static_cast<int64_t>(seq.tokens.size());
  return true;
}

struct PlannedStep {
  Sequence* seq;
  int64_t tokens;
  int64_t tentative = 0;  // draft tokens among them
};

// The logits rows one step gets back: its draft rows (or its last row) when it samples, every row when it scores
// its prompt.
struct StepRows {
  Sequence* seq;
  int64_t start, rows;  // the first row's position, and how many
  bool scores, samples;
};

// Every decoding sequence's next token, plus prompt chunks up to the prefill budget (oldest first).
// A chunk never ends inside a media span (so one may pass the budget).
std::vector<PlannedStep> plan_step(const std::vector<std::unique_ptr<Sequence>>& running, int64_t prefill_budget) {
  std::vector<PlannedStep> plan;
  for (const auto& s : running) {
    const int64_t pending = s->pending();
    if (pending == 1) {
      const int64_t drafted = static_cast<int64_t>(s->draft.tokens.size());
      plan.push_back({s.get(), 1 + drafted, drafted});
    } else if (prefill_budget > 0) {
      const int64_t n = chunk_outside_media(s->request.media, s->cache->length(), std::min(prefill_budget, pending));
      prefill_budget -= std::min(n, prefill_budget);
      plan.push_back({s.get(), n});
    }
  }
  return plan;
}

bool step_fits(const std::vector<PlannedStep>& plan, const KvPool& pool) {
  std::array<int64_t, kKvClasses> need{};
  for (const PlannedStep& p : plan) {
    const auto n = p.seq->cache->blocks_to_append(p.tokens, p.tentative);
    for (size_t c = 0; c < kKvClasses; ++c) need[c] += std::max<int64_t>(0, n[c]);
  }
  return pool.has_blocks(need);
}

// Preempts the youngest running sequences until the step's new blocks fit the pool. Returns them, youngest first.
std::vector<std::unique_ptr<Sequence>> make_room(std::vector<PlannedStep>& plan,
                                                 std::vector<std::unique_ptr<Sequence>>& running, const KvPool& pool) {
  std::vector<std::unique_ptr<Sequence>> preempted;
  while (running.size() > 1 && !step_fits(plan, pool)) {
    Sequence* victim = running.back().get();
    std::erase_if(plan, [&](const PlannedStep& p) { return p.seq == victim; });
    victim->cache.reset();
    preempted.push_back(std::move(running.back()));
    running.pop_back();
  }
  return preempted;
}

// The soft tokens of the media spans a newly admitted sequence will compute (those the prefix cache did not cover),
// from the media cache or else the tower, on the engine thread between steps. A span that fails to encode ends its
// sequence with an error. Returns whether any sequence ended.
template <class State>
bool encode_admitted_media(const std::vector<Sequence*>& admitted, const MediaTowers* towers, State& st) {
  bool ended = false;
  for (Sequence* seq : admitted) {
    try {
      for (MediaSpan& span : seq->request.media) {
        if (!span.embeddings.empty() || span.first + span.count <= seq->cache->length()) continue;
        bool hit = false;
        const LoraAdapter* lora = seq->request.lora.get();
        const MediaKey key = media_key_under(span.key, lora);
        if (const std::vector<float>* cached = st.media_cache.find(key)) {
          span.embeddings = *cached;
          hit = true;
        } else {
          span.embeddings = towers->encode(*span.prepared, lora);
          st.media_cache.insert(key, span.embeddings);
        }
        span.prepared.reset();
        std::lock_guard lock(st.mu);
        ++(hit ? st.stats.media_cache_hits : st.stats.media_encodes);
      }
    } catch (const std::exception& e) {
      finish(*seq, "error", e.what());
      ended = true;
    }
  }
  return ended;
}

}  // namespace

void Engine::loop() {
  State& st = *state_;
  std::vector<Sequence*> admitted;  // this round's, whose media may need encoding
  while (true) {
    {
      std::unique_lock lock(st.mu);
      st.wake.wait(lock, [&] { return st.stopping || !st.waiting.empty() || !st.running.empty(); });
      auto is_cancelled = [&](const std::unique_ptr<Sequence>& s) {
        return s->cancelled || std::find(st.cancelled.begin(), st.cancelled.end(), s->id) != st.cancelled.end();
      };
      std::erase_if(st.running, is_cancelled);  // a client gone: nothing more to deliver
      std::erase_if(st.waiting, is_cancelled);
      st.cancelled.clear();
      if (st.stopping) {
        for (auto& s : st.waiting) st.running.push_back(std::move(s));
        st.waiting.clear();
      }
      while (!st.stopping && !st.waiting.empty() && static_cast<int>(st.running.size()) < options_.max_running &&
             admit(*st.waiting.front(), st.pool, max_context_, st.stats)) {
        admitted.push_back(st.waiting.front().get());
        st.running.push_back(std::move(st.waiting.front()));
        st.waiting.pop_front();
      }
      st.running_count = static_cast<int>(st.running.size());
      st.lora_loads.set_running(st.running);
    }
    if (!st.stopping && encode_admitted_media(admitted, towers_, st)) {
      std::lock_guard lock(st.mu);
      std::erase_if(st.running, [](const auto& s) { return s->cancelled; });
      st.running_count = static_cast<int>(st.running.size());
    }
    admitted.clear();
    if (st.stopping) {
      for (auto& s : st.running) finish(*s, "abort");
      std::lock_guard lock(st.mu);
      st.running.clear();
      st.running_count = 0;
      st.idle.notify_all();
      return;
    }

    const int64_t hidden = model_.config().text.hidden_size;
    for (auto& s : st.running) {
      try {
        prepare_draft(*s, max_context_);
      } catch (const std::exception& e) {
        finish(*s, "error", e.what());
      }
    }
    std::erase_if(st.running, [](const auto& s) { return s->cancelled; });
    std::vector<PlannedStep> plan = plan_step(st.running, options_.prefill_chunk);
    std::vector<std::unique_ptr<Sequence>> preempted = make_room(plan, st.running, *st.pool);
    std::vector<SequenceStep> steps;
    std::vector<std::vector<SoftTokens>> soft(plan.size());  // each step's, alive through the forward pass
    std::vector<StepRows> outputs;  // the steps whose logits come back, in order
    for (const PlannedStep& p : plan) {
      Sequence& seq = *p.seq;
      const bool verifies = p.tentative > 0, last = verifies || p.tokens == seq.pending();
      const bool scores = !verifies && seq.scores_prompt();
      const int64_t start = seq.cache->length();
      std::vector<SoftTokens>& step_soft = soft[steps.size()];
      step_soft = step_soft_tokens(seq.request.media, start, verifies ? 1 : p.tokens, hidden);
      const bool wants_hidden = last && seq.drafter && seq.drafter->wants_target_hidden();
      steps.push_back({verifies ? std::span<const int32_t>(seq.step_tokens) : std::span(seq.tokens).subspan(start, p.tokens),
                       &*seq.cache, verifies || scores ? LogitsWanted::All : last ? LogitsWanted::Last : LogitsWanted::None,
                       step_soft, p.tentative, wants_hidden ? &seq.target_hidden : nullptr, seq.request.lora.get()});
      if (scores) outputs.push_back({p.seq, start, p.tokens, true, last});
      else if (last) outputs.push_back({p.seq, start, 1 + p.tentative, false, true});
    }
    uint64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
    std::vector<uint64_t> drafted_per_pos, accepted_per_pos;
    if (!steps.empty()) {
      try {
        std::vector<float> logits = model_.forward_batch(steps);
        const int64_t V = model_.config().text.vocab_size;
        int64_t row = 0;
        for (const StepRows& out : outputs) {
          Sequence* seq = out.seq;
          auto rows = std::span(logits).subspan(row * V, out.rows * V);
          row += out.rows;
          if (out.scores) {
            score_prompt_rows(*seq, rows, out.start, out.rows, V);
            rows = rows.last(V);  // the last position's: the first token's distribution
          }
          if (!out.samples) continue;
          if (seq->request.max_tokens == 0) {  // scored only
            finish(*seq, "length");
            continue;
          }
          const int64_t drafted = static_cast<int64_t>(seq->draft.tokens.size());
          try {  // one sequence's sampling error (every token banned, ...) ends that sequence only
            if (drafted == 0) {
              sample_next(*seq, rows, generation_);
              continue;
            }
            ++drafts;
            draft_tokens += drafted;
            const int64_t accepted = verify_draft(*seq, rows, V, generation_);
            accepted_tokens += accepted;
            count_positions(drafted_per_pos, drafted);
            count_positions(accepted_per_pos, accepted);
          } catch (const Error& e) {
            finish(*seq, "error", e.what());
          }
        }
      } catch (const std::exception& e) {
        for (const PlannedStep& p : plan) finish(*p.seq, "error", e.what());
      }
    }

    std::vector<KvEvent> kv_events = st.kv_events ? st.kv_events->take() : std::vector<KvEvent>{};
    const bool kv_changed = !kv_events.empty();
    if (kv_changed) options_.kv_events(std::move(kv_events));
    std::lock_guard lock(st.mu);
    if (kv_changed) st.kv_block_hashes = st.pool->reported_hashes();
    for (auto& s : preempted) st.waiting.push_front(std::move(s));  // youngest first: the oldest ends up in front
    st.stats.preemptions += preempted.size();
    st.stats.spec_drafts += drafts;
    st.stats.spec_draft_tokens += draft_tokens;
    st.stats.spec_accepted_tokens += accepted_tokens;
    add_counts(st.stats.spec_draft_tokens_per_pos, drafted_per_pos);
    add_counts(st.stats.spec_accepted_tokens_per_pos, accepted_per_pos);
    std::erase_if(st.running, [](const auto& s) { return s->cancelled; });
    st.running_count = static_cast<int>(st.running.size());
    st.lora_loads.set_running(st.running);
    ++st.stats.steps;
    st.stats.kv_tokens_used = 0;
    for (const auto& s : st.running) st.stats.kv_tokens_used += s->cache->length();
    st.stats.kv_bytes_used = st.pool->bytes_used();
    st.stats.kv_blocks_used = st.pool->blocks_used();
    if (st.pool->disk()) st.stats.prefix_disk_stats = st.pool->disk()->stats();
    if (st.running.empty() && st.waiting.empty()) st.idle.notify_all();
  }
}

}  // namespace qs
