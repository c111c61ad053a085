#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/stop_strings.h"
#include "model/gemma4.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {
namespace {

// One request from admission to its last event.
struct Sequence {
  Sequence(EngineRequest r, EventSink s, KvCache c, const Tokenizer* tokenizer)
      : sampler(r.sampling), stops(r.stop), request(std::move(r)), sink(std::move(s)), cache(std::move(c)) {
    if (tokenizer) decoder.emplace(*tokenizer, /*skip_special_tokens=*/true);
  }
  uint64_t id = 0;
  Sampler sampler;  // validates the sampling parameters
  StopStringMatcher stops;
  EngineRequest request;
  EventSink sink;
  KvCache cache;
  std::optional<StreamDecoder> decoder;
  int64_t prefilled = 0;            // prompt tokens already in the cache
  std::vector<int32_t> output;      // generated tokens
  std::optional<int32_t> next_input;  // sampled, not yet fed to the model
  bool cancelled = false;

  bool prefilling() const { return prefilled < static_cast<int64_t>(request.prompt.size()); }
};

}  // namespace

struct Engine::State {
  mutable std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // touched by the engine thread only
  std::vector<uint64_t> cancelled;
  uint64_t next_id = 1;
  bool accepting = true, stopping = false;
  int running_count = 0;
  EngineStats stats;
  std::thread thread;
};

Engine::Engine(const Gemma4Model& model, const Tokenizer* tokenizer, GenerationConfig generation,
               EngineOptions options)
    : model_(model), tokenizer_(tokenizer), generation_(std::move(generation)), options_(options),
      state_(std::make_unique<State>()) {
  const auto& text = model_.config().text;
  max_context_ = options_.max_context > 0 ? options_.max_context : text.max_position_embeddings_or(8192);
  state_->stats.kv_tokens_total = static_cast<int64_t>(options_.max_running) * max_context_;
  state_->stats.kv_bytes_total = options_.max_running * model_.new_cache(max_context_).capacity_bytes();
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
  if (request.max_tokens < 1) return invalid(fmt::format("max_tokens must be at least 1, got {}", request.max_tokens));
  if (prompt + request.max_tokens > max_context_)
    return invalid(fmt::format("the prompt has {} tokens and max_tokens is {}: {} positions, but the context holds {}",
                               prompt, request.max_tokens, prompt + request.max_tokens, max_context_));
  if (!request.stop.empty() && !tokenizer_) return invalid("stop: stop strings need the checkpoint's tokenizer");
  const int64_t vocab = model_.config().text.vocab_size;
  for (int32_t id : request.prompt)
    if (id < 0 || id >= vocab) return invalid(fmt::format("prompt: token id {} is outside the vocabulary (0..{})", id, vocab - 1));
  std::unique_ptr<Sequence> seq;
  try {
    seq = std::make_unique<Sequence>(std::move(request), std::move(sink), model_.new_cache(max_context_), tokenizer_);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  std::lock_guard lock(state_->mu);
  if (!state_->accepting) return {SubmitStatus::ShuttingDown, "the server is shutting down"};
  if (static_cast<int>(state_->waiting.size()) >= options_.max_waiting &&
      state_->running_count >= options_.max_running)
    return {SubmitStatus::QueueFull, fmt::format("{} requests are running and {} waiting", state_->running_count,
                                                 state_->waiting.size())};
  seq->id = state_->next_id++;
  uint64_t id = seq->id;
  state_->waiting.push_back(std::move(seq));
  state_->wake.notify_all();
  return {SubmitStatus::Accepted, "", id};
}

void Engine::cancel(uint64_t id) {
  std::lock_guard lock(state_->mu);
  state_->cancelled.push_back(id);
  state_->wake.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(state_->mu);
  EngineStats s = state_->stats;
  s.waiting = static_cast<int>(state_->waiting.size());
  s.running = state_->running_count;
  return s;
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
  deliver(seq, std::move(e));
  seq.cancelled = true;  // done: leaves the batch
}

// Samples the token after `logits`, streams it, and finishes the sequence on a stop or at max_tokens.
void sample_next(Sequence& seq, std::span<const float> logits, const GenerationConfig& generation) {
  SampledToken token = seq.sampler.sample(logits, seq.request.prompt, seq.output);
  seq.next_input.reset();
  const auto& stop_ids = seq.request.stop_token_ids;
  if (std::find(stop_ids.begin(), stop_ids.end(), token.id) != stop_ids.end() ||
      (!seq.request.ignore_eos && generation.is_eos(token.id)))
    return finish(seq, "stop");
  seq.output.push_back(token.id);
  EngineEvent e;
  e.tokens.push_back(token);
  bool stopped = false;
  if (seq.decoder) {
    StopScan scan = seq.stops.push(seq.decoder->push(token.id));
    e.text = std::move(scan.text);
    stopped = scan.stopped_by.has_value();
  }
  const bool length = static_cast<int64_t>(seq.output.size()) >= seq.request.max_tokens;
  if (stopped || length) return finish(seq, stopped ? "stop" : "length", "", std::move(e));
  seq.next_input = token.id;
  deliver(seq, std::move(e));
}

}  // namespace

void Engine::loop() {
  State& st = *state_;
  while (true) {
    {
      std::unique_lock lock(st.mu);
      st.wake.wait(lock, [&] { return st.stopping || !st.waiting.empty() || !st.running.empty(); });
      for (uint64_t id : st.cancelled)
        for (auto& s : st.running)
          if (s->id == id) s->cancelled = true;
      for (uint64_t id : st.cancelled)
        for (auto& s : st.waiting)
          if (s->id == id) s->cancelled = true;
      st.cancelled.clear();
      if (st.stopping) {
        for (auto& s : st.waiting) st.running.push_back(std::move(s));
        st.waiting.clear();
      }
      while (!st.waiting.empty() && static_cast<int>(st.running.size()) < options_.max_running) {
        st.running.push_back(std::move(st.waiting.front()));
        st.waiting.pop_front();
      }
      st.running_count = static_cast<int>(st.running.size());
    }
    if (st.stopping) {
      for (auto& s : st.running)
        if (!s->cancelled) finish(*s, "abort");
      std::lock_guard lock(st.mu);
      st.running.clear();
      st.running_count = 0;
      st.idle.notify_all();
      return;
    }

    // One step: every decoding sequence's next token, plus prompt chunks up to the prefill budget (oldest first).
    std::vector<SequenceStep> steps;
    std::vector<Sequence*> stepped;
    int64_t prefill_budget = options_.prefill_chunk;
    for (auto& s : st.running) {
      if (s->cancelled) continue;
      if (s->prefilling()) {
        if (prefill_budget <= 0) continue;
        const int64_t n = std::min<int64_t>(prefill_budget, s->request.prompt.size() - s->prefilled);
        prefill_budget -= n;
        const bool last = s->prefilled + n == static_cast<int64_t>(s->request.prompt.size());
        steps.push_back({std::span(s->request.prompt).subspan(s->prefilled, n), &s->cache,
                         last ? LogitsWanted::Last : LogitsWanted::None});
        s->prefilled += n;
        if (last) stepped.push_back(s.get());
      } else if (s->next_input) {
        steps.push_back({std::span(&*s->next_input, 1), &s->cache, LogitsWanted::Last});
        stepped.push_back(s.get());
      }
    }
    if (!steps.empty()) {
      try {
        std::vector<float> logits = model_.forward_batch(steps);
        const int64_t V = model_.config().text.vocab_size;
        for (size_t i = 0; i < stepped.size(); ++i) sample_next(*stepped[i], std::span(logits).subspan(i * V, V), generation_);
      } catch (const std::exception& e) {
        for (Sequence* s : stepped) finish(*s, "error", e.what());
      }
    }

    std::lock_guard lock(st.mu);
    std::erase_if(st.running, [](const auto& s) { return s->cancelled; });
    st.running_count = static_cast<int>(st.running.size());
    ++st.stats.steps;
    st.stats.kv_tokens_used = 0;
    st.stats.kv_bytes_used = 0;
    for (const auto& s : st.running) {
      st.stats.kv_tokens_used += s->cache.length();
      st.stats.kv_bytes_used += s->cache.bytes();
    }
    if (st.running.empty() && st.waiting.empty()) st.idle.notify_all();
  }
}

}  // namespace qs
