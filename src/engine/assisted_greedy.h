#pragma once
// Greedy decoding with a Gemma 4 assistant drafter (model/gemma4_assistant.h), as a simple draft/verify loop: each
// round the assistant drafts k tokens after the last token the target chose, the target runs that token and the
// drafts in one forward pass (on a copy of its KV cache), keeps the drafts up to the first it disagrees with and adds
// its own next token; when it rejects a draft, the kept tokens are run again on its cache. A draft is kept only where
// it is the target's argmax, so the ids are exactly plain greedy decoding's. A reference loop for the command line
// (the copy and the rerun cost what a real speculative engine avoids), not a fast path.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace qs {

class Gemma4Assistant;
class Gemma4Model;
class KvCache;

struct AssistedGreedyResult {
  std::vector<int32_t> tokens;  // generated ids, without the stop id that ended them
  bool stopped = false;         // a stop id ended them (else max_tokens)
  int64_t rounds = 0, drafted = 0, accepted = 0;  // target verification passes, drafts proposed, drafts kept
};

AssistedGreedyResult assisted_greedy(const Gemma4Model& target, const Gemma4Assistant& assistant,
                                     std::span<const int32_t> prompt, int64_t max_tokens,
                                     std::span<const int32_t> stop_ids, int64_t drafts_per_round);

// The same loop over any drafter: up to k tokens after `next` (the target's pick after the cache's last position),
// given the target's final-normed hidden state at that last position. `sliding_kept`: positions the target's
// sliding layers keep for it (Gemma4Model::new_cache).
using DraftFn = std::function<std::vector<int32_t>(std::span<const float> target_hidden, int32_t next,
                                                   const KvCache& cache, int64_t k)>;
AssistedGreedyResult assisted_greedy(const Gemma4Model& target, const DraftFn& draft, int64_t sliding_kept,
                                     std::span<const int32_t> prompt, int64_t max_tokens,
                                     std::span<const int32_t> stop_ids, int64_t drafts_per_round);

}  // namespace qs
