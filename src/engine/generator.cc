#include "engine/generator.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "engine/engine.h"
#include "model/gemma4.h"
#include "util/error.h"

namespace qs {

// One request through the batching engine, alone: the command line and the server share every rule (stops,
// eos, max_tokens, streaming text).
GenerationResult Generator::run(const GenerationRequest& req, const std::function<void(std::string_view)>& on_text) const {
  const int64_t limit = model_.config().text.max_position_embeddings_or(INT64_MAX);
  const int64_t prompt = static_cast<int64_t>(req.prompt.size());
  EngineRequest er{req.prompt, std::min(req.max_tokens, std::max<int64_t>(1, limit - prompt)), req.sampling, req.stop,
                   req.stop_token_ids, req.ignore_eos, req.constraint};
  er.media = req.media;
  er.speculative = req.speculative;
  er.lora = req.lora;
  EngineOptions options{.max_running = 1, .max_waiting = 1, .max_context = prompt + er.max_tokens};
  options.draft_model = draft_model_;
  options.assistant = assistant_;
  options.wrap_drafter = wrap_drafter_;
  options.max_draft_tokens = req.speculative.enabled() ? req.speculative.num_speculative_tokens : 0;
  Engine engine(model_, tokenizer_, generation_, options);

  std::mutex mu;
  std::condition_variable cv;
  GenerationResult result;
  bool done = false;
  auto start = std::chrono::steady_clock::now(), first = start;
  SubmitResult submitted = engine.submit(std::move(er), [&](EngineEvent&& e) {
    if (result.tokens.empty() && !e.tokens.empty()) first = std::chrono::steady_clock::now();
    for (auto& t : e.tokens) result.tokens.push_back(std::move(t));
    if (!e.text.empty()) {
      result.text += e.text;
      if (on_text) on_text(e.text);
    }
    if (e.finished) {
      std::lock_guard lock(mu);
      result.finish_reason = e.finish_reason == "error" ? "error: " + e.error : e.finish_reason;
      done = true;
      cv.notify_all();
    }
    return true;
  });
  if (submitted.status != SubmitStatus::Accepted) throw Error(submitted.error);
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  lock.unlock();
  if (result.finish_reason.starts_with("error: ")) throw Error(result.finish_reason.substr(7));
  auto end = std::chrono::steady_clock::now();
  // The first token arrives when the prompt has been processed: prefill ends there, decode follows.
  result.prefill_seconds = std::chrono::duration<double>(first - start).count();
  result.decode_seconds = std::chrono::duration<double>(end - first).count();
  engine.drain(std::chrono::minutes(1));  // returns once the engine has ended the step that finished the request,
  const EngineStats stats = engine.stats();  // so that its counters are in
  result.drafts = stats.spec_drafts;
  result.draft_tokens = stats.spec_draft_tokens;
  result.accepted_tokens = stats.spec_accepted_tokens;
  result.draft_tokens_per_pos = stats.spec_draft_tokens_per_pos;
  result.accepted_tokens_per_pos = stats.spec_accepted_tokens_per_pos;
  return result;
}

}  // namespace qs
