#pragma once
// Speculative decoding: a drafter proposes the next few tokens of a sequence cheaply, and the target model checks
// them all in one forward call (one SequenceStep with LogitsWanted::All over the last accepted token and the draft,
// its draft positions tentative in the KV cache). Position by position, the sampler picks the token the target
// would pick there (Sampler::verify: greedy = its argmax, sampling = rejection sampling against the draft
// distribution), which keeps the draft while they agree; the first disagreement gives the target's own token and
// drops the rest of the draft (KvCache::truncate). Because the kernels are batch-invariant, each verified position's
// logits equal a single-token step's bit for bit (tests/speculative_verify_test.cc): greedy output is identical with
// and without speculation, and sampling keeps the target's distribution.
//
// Drafters:
//   ngram        prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n
//                tokens (n from prompt_lookup_max down to prompt_lookup_min). Any model, no extra compute.
//   draft_model  a smaller model of the same vocabulary, with its own KV cache per sequence: it catches up on the
//                tokens accepted since its last draft, drops its rejected drafts, and samples its proposals with
//                the request's sampling parameters (its distributions go to the rejection test).
//   assistant    Gemma 4's own assistant drafters, which read the target's final-normed hidden state at the last
//                accepted position and its KV cache: DraftContext carries both (Drafter::wants_target_hidden).
//                Its drafts are greedy (point masses), so rejection sampling keeps the target's distribution
//                exactly; it reads only verified K/V (DraftContext::target_cache holds no draft position).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative_config.h"

namespace qs {

class Gemma4Assistant;
class Gemma4Model;
class KvCache;


// What a drafter sees of a sequence when asked for a draft.
struct DraftContext {
  std::span<const int32_t> tokens;  // prompt then accepted output; the last one is not yet in the target's cache
  int64_t prompt_length = 0;        // tokens[0, prompt_length) is the prompt (for the sampling penalties)
  int64_t max_tokens = 0;           // draft at most this many
  Sampler* sampler = nullptr;       // the request's parameters, with a generator of the drafter's own
  // For the assistant (when wants_target_hidden()): the target's final-normed hidden state at the position that
  // produced the last token [hidden], and its KV cache (positions 0 .. tokens.size() - 2, read-only).
  std::span<const float> target_hidden;
  const KvCache* target_cache = nullptr;
};

struct Draft {
  std::vector<int32_t> tokens;
  // Per token, the distribution it was drawn from; empty: point masses (a deterministic drafter).
  std::vector<TokenDistribution> distributions;
};

// One sequence's drafter. A drafter's proposal never changes what the sequence outputs, only how fast.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // ctx.tokens are the accepted tokens: a drafter with state (a KV cache) drops whatever of its last draft they
  // do not contain before proposing again.
  virtual Draft propose(const DraftContext& ctx) = 0;
  virtual bool wants_target_hidden() const { return false; }
};

// Prompt lookup over the token history.
class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int64_t min_n, int64_t max_n) : min_n_(min_n), max_n_(max_n) {}
  Draft propose(const DraftContext& ctx) override;

 private:
  int64_t min_n_, max_n_;
};

// A smaller model of the same vocabulary drafting autoregressively.
class DraftModelDrafter final : public Drafter {
 public:
  DraftModelDrafter(const Gemma4Model& model, int64_t max_context, int64_t max_draft);
  ~DraftModelDrafter() override;
  Draft propose(const DraftContext& ctx) override;

 private:
  const Gemma4Model& model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> cached_;  // the tokens in cache_, position by position
};

// Gemma 4's assistant drafter (model/gemma4_assistant.h) over the target's last hidden state and verified K/V.
class AssistantDrafter final : public Drafter {
 public:
  explicit AssistantDrafter(const Gemma4Assistant& assistant) : assistant_(assistant) {}
  Draft propose(const DraftContext& ctx) override;
  bool wants_target_hidden() const override { return true; }

 private:
  const Gemma4Assistant& assistant_;
};

// Replaces a sequence's drafter by one built around it (EngineOptions::wrap_drafter: bench's scripted acceptance).
using DrafterWrapper = std::function<std::unique_ptr<Drafter>(std::unique_ptr<Drafter>)>;

// The drafter for `config`; throws qs::Error naming what is missing (no draft model or assistant loaded, a draft
// model whose vocabulary differs from the target's).
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config, const Gemma4Model& target,
                                      const Gemma4Model* draft_model, int64_t max_context,
                                      const Gemma4Assistant* assistant = nullptr);

}  // namespace qs
