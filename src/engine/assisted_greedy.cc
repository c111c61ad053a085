#include "engine/assisted_greedy.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "util/error.h"

namespace qs {
namespace {

int32_t argmax(const float* row, int64_t vocab) { return static_cast<int32_t>(std::max_element(row, row + vocab) - row); }

}  // namespace

AssistedGreedyResult assisted_greedy(const Gemma4Model& target, const Gemma4Assistant& assistant,
                                     std::span<const int32_t> prompt, int64_t max_tokens,
                                     std::span<const int32_t> stop_ids, int64_t drafts_per_round) {
  const DraftFn draft = [&](std::span<const float> hidden, int32_t next, const KvCache& cache, int64_t k) {
    return assistant.draft(hidden, next, cache, k);
  };
  return assisted_greedy(target, draft, assistant.sliding_kept(), prompt, max_tokens, stop_ids, drafts_per_round);
}

AssistedGreedyResult assisted_greedy(const Gemma4Model& target, const DraftFn& draft, int64_t sliding_kept,
                                     std::span<const int32_t> prompt, int64_t max_tokens,
                                     std::span<const int32_t> stop_ids, int64_t drafts_per_round) {
  if (prompt.empty()) throw Error("assisted greedy decoding: the prompt is empty");
  if (drafts_per_round < 1) throw Error("assisted greedy decoding: drafts per round must be at least 1");
  const int64_t V = target.config().text.vocab_size, H = target.config().text.hidden_size, k = drafts_per_round;
  // Room for the prompt, the output and one round's drafts; sliding layers keep what the drafter reads.
  KvCache cache = target.new_cache(static_cast<int64_t>(prompt.size()) + max_tokens + k, 0, sliding_kept);
  AssistedGreedyResult r;
  auto stops = [&](int32_t id) { return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end(); };
  std::vector<float> hidden;
  SequenceStep prefill{prompt, &cache, LogitsWanted::Last, {}, 0, &hidden};
  std::vector<float> logits = target.forward_batch(std::span(&prefill, 1));
  int32_t next = argmax(logits.data(), V);  // the target's pick after the cache's last position
  std::vector<int32_t> run;
  while (static_cast<int64_t>(r.tokens.size()) < max_tokens) {
    if (stops(next)) return r.stopped = true, r;
    r.tokens.push_back(next);
    const int64_t room = max_tokens - static_cast<int64_t>(r.tokens.size());
    if (room == 0) break;
    std::vector<int32_t> drafts = draft(hidden, next, cache, std::min(k, room));
    drafts.resize(std::min<size_t>(drafts.size(), std::min(k, room)));
    run.assign(1, next);
    run.insert(run.end(), drafts.begin(), drafts.end());
    // The target checks the drafts on a copy of its cache: the positions of rejected drafts must not stay in it.
    KvCache trial = cache;
    SequenceStep verify{run, &trial, LogitsWanted::All, {}, 0, &hidden};
    logits = target.forward_batch(std::span(&verify, 1));
    ++r.rounds;
    r.drafted += static_cast<int64_t>(drafts.size());
    size_t kept = 0;  // drafts the target agrees with: row i's argmax is the token after run[i]
    while (kept < drafts.size() && argmax(logits.data() + kept * V, V) == drafts[kept] && !stops(drafts[kept]) &&
           static_cast<int64_t>(r.tokens.size()) < max_tokens) {
      r.tokens.push_back(drafts[kept]);
      ++kept;
    }
    r.accepted += static_cast<int64_t>(kept);
    next = argmax(logits.data() + kept * V, V);
    hidden.erase(hidden.begin(), hidden.begin() + kept * H);
    hidden.resize(H);
    if (kept == drafts.size()) {
      cache = std::move(trial);
    } else {  // the kept run again on the cache itself: each row's K/V are the bits it gets in any batch
      SequenceStep keep{std::span(run).first(kept + 1), &cache, LogitsWanted::None};
      target.forward_batch(std::span(&keep, 1));
    }
  }
  return r;
}

}  // namespace qs
