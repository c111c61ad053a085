#include "bench/speculative_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "bench/bench_util.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "model/gemma4_assistant.h"
#include "util/error.h"

namespace qs {

double expected_tokens_per_round(double alpha, int64_t k) {
  return alpha >= 1 ? double(k + 1) : (1 - std::pow(alpha, double(k + 1))) / (1 - alpha);
}

double projected_speedup(double alpha, const RoundCost& cost, double step_seconds) {
  return expected_tokens_per_round(alpha, cost.k) * step_seconds / (cost.draft_seconds + cost.verify_seconds);
}

namespace {

using namespace bench_util;

// The speculative rows' prompt: one 32-token segment over and over, so that prompt lookup finds what follows.
std::vector<int32_t> copy_prompt(const Gemma4TextConfig& c, int64_t length) {
  const std::vector<int32_t> segment = bench_tokens(c, 32, 11);
  std::vector<int32_t> ids(length);
  for (int64_t i = 0; i < length; ++i) ids[i] = segment[i % 32];
  return ids;
}

// The drafter models a speculative bench loads beside the target (none for prompt lookup).
struct DrafterModels {
  std::unique_ptr<Gemma4Model> draft_model;
  std::unique_ptr<Gemma4Assistant> assistant;
};

SamplingParams greedy_sampling() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

GenerationRequest greedy_request(const std::vector<int32_t>& prompt, int64_t tokens, const SpeculativeConfig& spec) {
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = tokens;
  req.sampling = greedy_sampling();
  req.ignore_eos = true;
  req.speculative = spec;
  return req;
}

// The first token comes from the prefill; the rest from decode steps (or rounds).
double decode_speed(const GenerationResult& g) { return double(g.tokens.size() - 1) / g.decode_seconds; }

std::vector<int32_t> ids_of(const GenerationResult& g) {
  std::vector<int32_t> ids;
  for (const SampledToken& t : g.tokens) ids.push_back(t.id);
  return ids;
}

// --draft-acceptance: the drafter proposes as usual (its time counts), then each proposed token becomes the token
// plain greedy decoding gave at its position with probability `acceptance`, independently, else the next id. The
// target's verification accepts exactly the right ones up to the first wrong one, as with a drafter of that
// per-token agreement (what the projection assumes).
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::unique_ptr<Drafter> drafter, const std::vector<int32_t>& greedy, double acceptance,
                  int64_t vocab, uint32_t run)
      : drafter_(std::move(drafter)), greedy_(greedy), acceptance_(acceptance), vocab_(vocab) {
    std::seed_seq seed{run};  // the raw small seeds 1, 2, ... gave runs of agreement well above the asked probability
    random_.seed(seed);
  }
  Draft propose(const DraftContext& ctx) override {
    Draft d = drafter_->propose(ctx);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      const size_t at = ctx.tokens.size() + i;
      if (at >= greedy_.size()) break;  // past the run's end: left as drafted
      const bool agree = std::uniform_real_distribution<double>(0, 1)(random_) < acceptance_;
      d.tokens[i] = agree ? greedy_[at] : static_cast<int32_t>((greedy_[at] + 1) % vocab_);
    }
    return d;
  }
  bool wants_target_hidden() const override { return drafter_->wants_target_hidden(); }

 private:
  std::unique_ptr<Drafter> drafter_;
  const std::vector<int32_t>& greedy_;  // the prompt, then plain greedy decoding's output
  double acceptance_;
  int64_t vocab_;
  std::mt19937_64 random_;
};

// Plain greedy decoding, then with the drafter at each k, in turn within each repeat (A, B, C, A, B, C, ...), all
// through the engine (Generator): its rounds are the engine's own (the drafter's proposal, one verify step,
// Sampler::verify, the cache truncated to what was accepted).
void speculative_rows(const Gemma4Model& model, const DrafterModels& d, const BenchOptions& o,
                      const std::vector<int32_t>& prompt, SpeculativeReport& s) {
  Generator generator(model, nullptr, GenerationConfig{}, d.draft_model.get(), d.assistant.get());
  std::vector<int32_t> greedy;  // what --draft-acceptance scripts the drafts from
  uint32_t runs = 0;  // each speculative run draws from a generator of its own
  if (o.draft_acceptance)
    generator.wrap_drafters([&](std::unique_ptr<Drafter> drafter) -> std::unique_ptr<Drafter> {
      return std::make_unique<ScriptedDrafter>(std::move(drafter), greedy, *o.draft_acceptance,
                                               model.config().text.vocab_size, ++runs);
    });
  for (int64_t k : o.speculative_tokens) s.rows.push_back({.k = k});
  for (int r = 0; r < o.repeat; ++r) {
    const GenerationResult plain = generator.run(greedy_request(prompt, o.decode_tokens, {}));
    s.plain_runs.push_back(decode_speed(plain));
    greedy = prompt;
    for (int32_t id : ids_of(plain)) greedy.push_back(id);
    for (SpeculativeRow& row : s.rows) {
      SpeculativeConfig spec = o.speculative;
      spec.num_speculative_tokens = row.k;
      const GenerationResult g = generator.run(greedy_request(prompt, o.decode_tokens, spec));
      row.runs.push_back(decode_speed(g));
      row.rounds += g.drafts;
      row.draft_tokens += g.draft_tokens;
      row.accepted_tokens += g.accepted_tokens;
      row.same_ids = row.same_ids && ids_of(g) == ids_of(plain);
    }
  }
  s.plain_tokens_per_second = median(s.plain_runs);
  for (SpeculativeRow& row : s.rows) {
    row.tokens_per_second = median(row.runs);
    row.ratio = row.tokens_per_second / s.plain_tokens_per_second;
  }
}

template <class Call>
double seconds_of(Call&& call) {
  auto t0 = Clock::now();
  call();
  return seconds_since(t0);
}

// A round's parts at the prompt's end, each call undone (KvCache::truncate) so that every one sees the same cache:
// one plain step, and for k = 1 .. the largest k the drafter proposing k tokens and one target call verifying
// k + 1 positions (the last token and k drafts; its cost does not depend on which tokens they are). The calls take
// turns (step, then each k's draft and verify, again and again), so that the machine's load reaches them alike;
// medians of at least 5 turns.
void round_costs(const Gemma4Model& model, const DrafterModels& d, const BenchOptions& o,
                 const std::vector<int32_t>& prompt, const ReadBytes& rb, SpeculativeReport& s) {
  const int64_t max_k = *std::max_element(o.speculative_tokens.begin(), o.speculative_tokens.end());
  const int64_t context = static_cast<int64_t>(prompt.size()) + max_k + 2;
  KvCache cache = model.new_cache(context, max_k + 1, d.assistant ? d.assistant->sliding_kept() : 0);
  std::vector<float> hidden;  // the target's final hidden state at the prompt's last position (the assistant's)
  const SequenceStep first{prompt, &cache, LogitsWanted::Last, {}, 0, &hidden};
  const std::vector<float> logits = model.forward_batch(std::span(&first, 1));
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  const int64_t length = cache.length();
  const bool with_hidden = o.speculative.method == SpeculativeMethod::Assistant;  // as the engine asks for it
  auto target_call = [&](std::span<const int32_t> ids, LogitsWanted wanted, bool wants_hidden) {
    std::vector<float> h;
    const SequenceStep step{ids, &cache, wanted, {}, static_cast<int64_t>(ids.size()), wants_hidden ? &h : nullptr};
    model.forward_batch(std::span(&step, 1));
    cache.truncate(length);
  };
  Sampler sampler(greedy_sampling());
  const int turns = std::max(5, o.repeat);
  std::vector<std::unique_ptr<Drafter>> drafters;
  std::vector<std::vector<int32_t>> verified;  // per k: the last token and k more
  for (int64_t k = 1; k <= max_k; ++k) {
    SpeculativeConfig spec = o.speculative;
    spec.num_speculative_tokens = k;
    drafters.push_back(make_drafter(spec, model, d.draft_model.get(), context + turns, d.assistant.get()));
    verified.push_back(bench_tokens(model.config().text, k + 1, 3));
    verified.back().front() = tokens.back();
  }
  // A draft model keeps a cache of what it saw and may not be asked twice about the same tokens: each turn gives
  // it one token more (a round's catch-up). Prompt lookup and the assistant see the prompt's end every turn.
  std::vector<int32_t> seen = tokens;
  const std::vector<int32_t> more = bench_tokens(model.config().text, turns, 5);
  auto context_of = [&](int64_t k) {
    return DraftContext{seen, static_cast<int64_t>(prompt.size()), k, &sampler, hidden, &cache};
  };
  for (int64_t k = 1; k <= max_k; ++k) drafters[k - 1]->propose(context_of(k));  // a draft model runs the prompt
  std::vector<double> step;
  std::vector<std::vector<double>> draft(max_k), verify(max_k);
  for (int turn = 0; turn < turns; ++turn) {
    if (d.draft_model) seen.push_back(more[turn]);
    step.push_back(seconds_of([&] { target_call(std::span(tokens).last(1), LogitsWanted::Last, false); }));
    for (int64_t k = 1; k <= max_k; ++k) {
      draft[k - 1].push_back(seconds_of([&] { drafters[k - 1]->propose(context_of(k)); }));
      verify[k - 1].push_back(seconds_of([&] { target_call(verified[k - 1], LogitsWanted::All, with_hidden); }));
    }
  }
  s.step_seconds = median(step);
  s.step_weight_bytes = rb.call_weights(1, 1) + rb.gather;
  for (int64_t k = 1; k <= max_k; ++k)
    s.costs.push_back({.k = k, .draft_seconds = median(draft[k - 1]), .verify_seconds = median(verify[k - 1]),
                       .verify_weight_bytes = rb.call_weights(k + 1, k + 1) + uint64_t(k + 1) * rb.gather});
}

std::string drafter_name(const BenchOptions& o) {
  switch (o.speculative.method) {
    case SpeculativeMethod::Assistant: return "assistant " + o.assistant.string();
    case SpeculativeMethod::DraftModel: return "draft model " + o.draft_model.string();
    default:
      return fmt::format("prompt lookup, n = {}..{}", o.speculative.prompt_lookup_min, o.speculative.prompt_lookup_max);
  }
}

}  // namespace

SpeculativeReport speculative_bench(const Gemma4Model& model, const BenchOptions& o, const ReadBytes& rb,
                                    const std::function<void(const std::string&)>& log) {
  if (o.decode_tokens < 2) throw Error("bench --speculative: --decode-tokens must be at least 2");
  if (o.speculative_prompt < 1) throw Error("bench --speculative: the prompt must have at least one token");
  if (o.draft_acceptance && !(*o.draft_acceptance >= 0 && *o.draft_acceptance <= 1))
    throw Error(fmt::format("bench --draft-acceptance: {} is not a probability (0 to 1)", *o.draft_acceptance));
  for (int64_t k : o.speculative_tokens) {
    SpeculativeConfig spec = o.speculative;
    spec.num_speculative_tokens = k;
    spec.validate();  // names the field and its range
  }
  DrafterModels d;
  if (!o.draft_model.empty()) d.draft_model = Gemma4Model::load(o.draft_model, model.precision(), true);
  if (!o.assistant.empty()) d.assistant = Gemma4Assistant::load(o.assistant, model, true);
  make_drafter(o.speculative, model, d.draft_model.get(), 1, d.assistant.get());  // throws naming what is missing
  SpeculativeReport s{.method = std::string(speculative_method_name(o.speculative.method)),
                      .drafter = drafter_name(o),
                      .prompt_tokens = o.speculative_prompt,
                      .decode_tokens = o.decode_tokens,
                      .scripted_acceptance = o.draft_acceptance};
  const std::vector<int32_t> prompt = copy_prompt(model.config().text, o.speculative_prompt);
  round_costs(model, d, o, prompt, rb, s);
  log(fmt::format("round costs measured: one step {:.2f} ms", 1e3 * s.step_seconds));
  speculative_rows(model, d, o, prompt, s);
  for (const SpeculativeRow& row : s.rows)
    log(fmt::format("speculative k={}: {:.2f} tokens/s against {:.2f} plain, acceptance {:.2f}", row.k,
                    row.tokens_per_second, s.plain_tokens_per_second, row.acceptance()));
  return s;
}

}  // namespace qs
