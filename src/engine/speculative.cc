#include "engine/speculative.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/kv_cache.h"
#include "util/error.h"

namespace qs {

// The longest suffix first: the latest earlier place where the last n tokens occurred, and what followed it there.
Draft NgramDrafter::propose(const DraftContext& ctx) {
  const auto t = ctx.tokens;
  const int64_t size = static_cast<int64_t>(t.size());
  Draft draft;
  for (int64_t n = std::min(max_n_, size - 1); n >= min_n_ && draft.tokens.empty(); --n) {
    const auto suffix = t.last(n);
    for (int64_t start = size - n - 1; start >= 0; --start) {  // the occurrence ends before the suffix's end
      if (!std::equal(suffix.begin(), suffix.end(), t.begin() + start)) continue;
      const int64_t from = start + n, count = std::min(ctx.max_tokens, size - from);
      draft.tokens.assign(t.begin() + from, t.begin() + from + count);
      break;
    }
  }
  return draft;
}

DraftModelDrafter::DraftModelDrafter(const Gemma4Model& model, int64_t max_context, int64_t max_draft)
    : model_(model), cache_(std::make_unique<KvCache>(model.new_cache(max_context, max_draft))) {}

DraftModelDrafter::~DraftModelDrafter() = default;

Draft DraftModelDrafter::propose(const DraftContext& ctx) {
  const auto t = ctx.tokens;
  const int64_t size = static_cast<int64_t>(t.size());
  Draft draft;
  if (ctx.max_tokens < 1 || size < 1) return draft;
  // Keep what the cache holds of the accepted tokens (its drafts the target rejected go), but compute the last
  // token again if it is there: its logits give the first draft. The last token stays tentative in the cache, as
  // the drafts do, so that it can be computed again when the same tokens come back (a sequence preempted after
  // drafting proposes again for them).
  const int64_t common = std::mismatch(cached_.begin(), cached_.end(), t.begin(), t.end()).first - cached_.begin();
  const int64_t keep = std::min(common, size - 1);
  cache_->truncate(keep);
  cached_.resize(keep);
  std::vector<int32_t> output(t.begin() + ctx.prompt_length, t.end());
  const SequenceStep last{t.subspan(keep), cache_.get(), LogitsWanted::Last, {}, 1};
  std::vector<float> logits = model_.forward_batch(std::span(&last, 1));
  cached_.insert(cached_.end(), t.begin() + keep, t.end());
  while (true) {
    TokenDistribution d = ctx.sampler->distribution(logits, t.first(ctx.prompt_length), output);
    const int32_t token = ctx.sampler->draw(d);
    draft.tokens.push_back(token);
    draft.distributions.push_back(std::move(d));
    if (static_cast<int64_t>(draft.tokens.size()) == ctx.max_tokens) break;
    output.push_back(token);
    SequenceStep step{std::span(&draft.tokens.back(), 1), cache_.get(), LogitsWanted::Last, {}, 1};
    logits = model_.forward_batch(std::span(&step, 1));
    cached_.push_back(token);
  }
  return draft;
}

// Greedy drafts after the last accepted token. Without the target's hidden state (nothing ran yet) or when the cache
// holds more than the verified tokens before the last one, there is nothing clean to read: no draft.
Draft AssistantDrafter::propose(const DraftContext& ctx) {
  Draft draft;
  const int64_t verified = static_cast<int64_t>(ctx.tokens.size()) - 1;
  if (ctx.max_tokens < 1 || verified < 1 || ctx.target_hidden.empty() || !ctx.target_cache ||
      ctx.target_cache->length() != verified)
    return draft;
  draft.tokens = assistant_.draft(ctx.target_hidden, ctx.tokens.back(), *ctx.target_cache, ctx.max_tokens);
  return draft;
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config, const Gemma4Model& target,
                                      const Gemma4Model* draft_model, int64_t max_context,
                                      const Gemma4Assistant* assistant) {
  config.validate();
  switch (config.method) {
    case SpeculativeMethod::None: return nullptr;
    case SpeculativeMethod::Ngram:
      return std::make_unique<NgramDrafter>(config.prompt_lookup_min, config.prompt_lookup_max);
    case SpeculativeMethod::DraftModel: {
      if (!draft_model) throw Error("speculative method draft_model: no draft model is loaded (--draft-model DIR)");
      const int64_t v = draft_model->config().text.vocab_size, want = target.config().text.vocab_size;
      if (v != want)
        throw Error(fmt::format("the draft model's vocabulary has {} tokens, the target's {}: they must be the same",
                                v, want));
      return std::make_unique<DraftModelDrafter>(*draft_model, max_context, config.num_speculative_tokens);
    }
    case SpeculativeMethod::Assistant:
      if (!assistant) throw Error("speculative method assistant: no assistant drafter is loaded (--assistant DIR)");
      return std::make_unique<AssistantDrafter>(*assistant);
  }
  return nullptr;
}

}  // namespace qs
