// Speculative decoding: rejection sampling keeps the target distribution (a chi-square and total-variation bound on a
// tiny vocabulary, fixed seeds: deterministic), greedy verification is the sampler's own argmax; prompt lookup drafts
// what followed the latest earlier occurrence; and through the engine, greedy output with n-gram drafting or a draft
// model (the model itself, another random model, a different architecture of the same vocabulary) is bit-identical
// to greedy output without, alone, batched and under preemption, and with stop strings and JSON Schema constraints
// on the trained demo model.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "checkpoint_tools/synth.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "engine_events.h"

namespace qs {
namespace {

using test::Collected;

// ---- Rejection sampling ---------------------------------------------------------------------------------------

const std::vector<float> kLogits = {2.0f, 1.5f, 1.4f, 0.3f, -0.2f, -1.0f, 0.9f, -3.0f};

SamplingParams sampling_params() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 6;   // two tokens truncated away: p = 0 there
  p.top_p = 0.97f;
  p.presence_penalty = 0.5f;  // applied to the output tokens below, as in a real sequence
  p.seed = 11;
  return p;
}
const std::vector<int32_t> kPrompt = {0, 1}, kOutput = {2, 2, 6};

struct Tally {
  std::vector<double> freq;
  double accepted = 0;
};

// `trials` verifications of drafts drawn from q (point masses when `point_mass`), with the target sampler.
Tally run_trials(const TokenDistribution& q, bool point_mass, int trials) {
  Sampler target(sampling_params());
  std::mt19937_64 rng(1234);
  std::vector<double> weights(kLogits.size(), 0);
  for (auto [id, p] : q) weights[id] = p;
  std::discrete_distribution<int> pick_q(weights.begin(), weights.end());
  Tally t{std::vector<double>(kLogits.size(), 0)};
  for (int i = 0; i < trials; ++i) {
    const int32_t draft = pick_q(rng);
    SampledToken tok = target.verify(kLogits, kPrompt, kOutput, {}, draft, point_mass ? TokenDistribution{} : q);
    t.freq[tok.id] += 1.0 / trials;
    t.accepted += (tok.id == draft) / double(trials);
  }
  return t;
}

// Pearson's chi-square of the observed frequencies against p, over p's support; and whether anything fell outside.
double chi_square(const Tally& t, const std::vector<double>& p, int trials, bool& outside) {
  double chi = 0;
  outside = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      outside |= t.freq[i] > 0;
      continue;
    }
    const double expected = p[i] * trials, observed = t.freq[i] * trials;
    chi += (observed - expected) * (observed - expected) / expected;
  }
  return chi;
}

std::vector<double> dense(const TokenDistribution& d) {
  std::vector<double> out(kLogits.size(), 0);
  for (auto [id, p] : d) out[id] = p;
  return out;
}

}  // namespace

TEST(SpeculativeSampling, RejectionSamplingKeepsTheTargetDistribution) {
  Sampler probe(sampling_params());
  const std::vector<double> p = dense(probe.distribution(kLogits, kPrompt, kOutput));
  ASSERT_EQ(p[7], 0.0);  // truncated by top-k: a draft of it must always be rejected
  const TokenDistribution uniform = {{0, .125f}, {1, .125f}, {2, .125f}, {3, .125f},
                                     {4, .125f}, {5, .125f}, {6, .125f}, {7, .125f}};
  const TokenDistribution skewed = {{0, .05f}, {2, .6f}, {3, .05f}, {5, .2f}, {7, .1f}};
  constexpr int kTrials = 60000;
  struct Draft {
    const char* name;
    TokenDistribution q;
    bool point_mass;
  };
  for (const Draft& d : {Draft{"n-gram point masses", uniform, true}, Draft{"draft model, uniform q", uniform, false},
                         Draft{"draft model, skewed q", skewed, false}}) {
    const Tally t = run_trials(d.q, d.point_mass, kTrials);
    bool outside = false;
    // At most 5 degrees of freedom here: 30 is past the 0.99999 quantile (25.7), yet a sampler that returned the
    // draft unverified, or the residual unrenormalised, lands in the thousands.
    EXPECT_LT(chi_square(t, p, kTrials, outside), 30.0) << d.name;
    EXPECT_FALSE(outside) << d.name << ": a token outside the target's support was output";
    double tv = 0, accept = 0;
    const std::vector<double> q = dense(d.q);
    for (size_t i = 0; i < p.size(); ++i) {
      tv += std::fabs(t.freq[i] - p[i]) / 2;
      accept += d.point_mass ? q[i] * p[i] : std::min(p[i], q[i]);  // the theoretical acceptance rate
    }
    EXPECT_LT(tv, 0.01) << d.name;
    EXPECT_NEAR(t.accepted, accept, 0.01) << d.name;
  }
}

TEST(SpeculativeSampling, GreedyVerificationIsTheSamplersArgmax) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.3f;
  Sampler s(p);
  const int32_t argmax = s.sample(kLogits, kPrompt, kOutput).id;
  const std::vector<uint64_t> mask = {0b11111110};  // token 0 masked (a grammar would reject it)
  const int32_t masked = s.sample(kLogits, kPrompt, kOutput, mask).id;
  ASSERT_NE(argmax, masked);
  for (int32_t draft = 0; draft < 8; ++draft) {
    EXPECT_EQ(s.verify(kLogits, kPrompt, kOutput, {}, draft, {}).id, argmax);
    EXPECT_EQ(s.verify(kLogits, kPrompt, kOutput, mask, draft, {}).id, masked);
  }
}

TEST(SpeculativeDraft, NgramProposesWhatFollowedTheLatestEarlierOccurrence) {
  NgramDrafter d(1, 3), two(1, 2);
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7};
  DraftContext ctx{t, 2, 4};
  EXPECT_EQ(d.propose(ctx).tokens, (std::vector<int32_t>{8, 9, 6, 7}));    // the longest suffix, "5 6 7", first
  EXPECT_EQ(two.propose(ctx).tokens, (std::vector<int32_t>{1, 2, 5, 6}));  // "6 7": its latest earlier occurrence
  ctx.max_tokens = 2;
  EXPECT_EQ(two.propose(ctx).tokens, (std::vector<int32_t>{1, 2}));
  const std::vector<int32_t> none = {1, 2, 3, 4};
  EXPECT_TRUE(d.propose({none, 1, 4}).tokens.empty());
  const std::vector<int32_t> tail = {3, 9, 3};  // only one token follows the match
  EXPECT_EQ(d.propose({tail, 1, 4}).tokens, (std::vector<int32_t>{9, 3}));
}

TEST(SpeculativeDraft, ConfigurationErrorsNameWhatIsMissing) {
  EXPECT_THROW(parse_speculative_method("eagle"), Error);
  SpeculativeConfig c{SpeculativeMethod::Ngram, 0};
  EXPECT_THROW(c.validate(), Error);
}

namespace {

// ---- Through the engine ---------------------------------------------------------------------------------------

std::filesystem::path synth(const test::TempDir& tmp, const std::string& preset, uint64_t seed) {
  return test::synth_quietly({.preset = preset, .out = tmp / (preset + "-" + std::to_string(seed)), .seed = seed});
}

// Prompts that repeat themselves, so that prompt lookup finds something to draft.
EngineRequest greedy_request(int salt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = {2};
  for (int rep = 0; rep < 3; ++rep)
    for (int i = 0; i < 7; ++i) r.prompt.push_back(10 + (i * 31 + salt * 7) % 4000);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// Every request through one engine at once; returns each one's tokens.
Outcome run_all(const Gemma4Model& model, const Gemma4Model* draft, EngineOptions options,
                std::vector<EngineRequest> requests, const Tokenizer* tokenizer = nullptr,
                GenerationConfig generation = {}) {
  options.draft_model = draft;
  Engine engine(model, tokenizer, generation, options);
  std::vector<Collected> got(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    SubmitResult r = engine.submit(std::move(requests[i]), got[i].sink());
    EXPECT_EQ(r.status, SubmitStatus::Accepted) << r.error;
  }
  Outcome out;
  for (auto& c : got) {
    c.wait();
    out.tokens.push_back(c.tokens);
  }
  out.stats = engine.stats();
  return out;
}

std::vector<EngineRequest> with(std::vector<EngineRequest> rs, SpeculativeConfig c) {
  for (auto& r : rs) r.speculative = c;
  return rs;
}

}  // namespace

TEST(SpeculativeEngine, GreedyOutputIsIdenticalWithNgramAndDraftModels) {
  test::TempDir tmp;
  auto target = Gemma4Model::load(synth(tmp, "e2b-tiny", 0), Precision::F32);
  auto other = Gemma4Model::load(synth(tmp, "e2b-tiny", 7), Precision::F32);
  auto moe = Gemma4Model::load(synth(tmp, "26b-a4b-tiny", 3), Precision::F32);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(greedy_request(i, 30 + 4 * i));  // long enough to repeat itself
  const EngineOptions options{.max_running = 4, .max_draft_tokens = 4};
  const Outcome plain = run_all(*target, nullptr, options, requests);
  EXPECT_EQ(plain.stats.spec_draft_tokens, 0u);

  const Outcome ngram = run_all(*target, nullptr, options, with(requests, {SpeculativeMethod::Ngram, 3}));
  EXPECT_EQ(ngram.tokens, plain.tokens) << "ngram";
  EXPECT_GT(ngram.stats.spec_draft_tokens, 0u) << "a random model rarely repeats itself, but does in 30 tokens";

  const Outcome self = run_all(*target, target.get(), options, with(requests, {SpeculativeMethod::DraftModel, 4}));
  EXPECT_EQ(self.tokens, plain.tokens) << "the model drafting for itself";
  EXPECT_EQ(self.stats.spec_accepted_tokens, self.stats.spec_draft_tokens) << "it agrees with itself every time";
  EXPECT_GT(self.stats.spec_draft_tokens, 0u);

  for (auto [name, draft] : {std::pair{"another random e2b-tiny", other.get()}, std::pair{"a MoE draft", moe.get()}}) {
    const Outcome o = run_all(*target, draft, options, with(requests, {SpeculativeMethod::DraftModel, 3}));
    EXPECT_EQ(o.tokens, plain.tokens) << name;
    EXPECT_GT(o.stats.spec_draft_tokens, o.stats.spec_accepted_tokens) << name << ": some drafts were rejected";
  }
}

TEST(SpeculativeEngine, DefaultFromTheEngineAndPerRequestOptOut) {
  test::TempDir tmp;
  auto target = Gemma4Model::load(synth(tmp, "e2b-tiny", 0), Precision::BF16);
  const std::vector<EngineRequest> requests = {greedy_request(1, 12), greedy_request(2, 7)};
  const Outcome plain = run_all(*target, nullptr, {.max_running = 2}, requests);
  EngineOptions spec{.max_running = 2};
  spec.speculative = {SpeculativeMethod::DraftModel, 5};
  const Outcome by_default = run_all(*target, target.get(), spec, requests);
  EXPECT_EQ(by_default.tokens, plain.tokens);
  EXPECT_GT(by_default.stats.spec_draft_tokens, 0u);
  const Outcome opted_out = run_all(*target, target.get(), spec, with(requests, {SpeculativeMethod::None}));
  EXPECT_EQ(opted_out.tokens, plain.tokens);
  EXPECT_EQ(opted_out.stats.spec_draft_tokens, 0u);
}

TEST(SpeculativeEngine, PreemptedSpeculatingSequencesContinueExactly) {
  test::TempDir tmp;
  auto target = Gemma4Model::load(synth(tmp, "e2b-tiny", 0), Precision::F32);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(greedy_request(10 + i, 40));
  const Outcome plain = run_all(*target, nullptr, {.max_running = 3}, requests);
  // Room for about one and a half sequences: the youngest are preempted and recompute, drafts and all.
  const KvLayout layout = target->kv_layout(4);
  EngineOptions tight{.max_running = 3, .prefill_chunk = 8, .max_context = 64, .kv_block_size = 4,
                      .max_draft_tokens = 4};
  tight.kv_bytes = 20 * layout.block_bytes(KvClass::Full) + 12 * layout.block_bytes(KvClass::Sliding);
  const Outcome spec = run_all(*target, target.get(), tight, with(requests, {SpeculativeMethod::DraftModel, 4}));
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.preemptions, 0u);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

// The engine drafts for every running sequence before it makes room, so a sequence it then preempts proposes again
// for the same tokens when it runs again: the drafter gives the same draft (it once refused, the last token being
// fixed in its cache).
TEST(SpeculativeEngine, ADraftModelProposesAgainForTheSameTokens) {
  test::TempDir tmp;
  auto model = Gemma4Model::load(synth(tmp, "e2b-tiny", 0), Precision::F32);
  DraftModelDrafter drafter(*model, 64, 4);
  Sampler sampler(SamplingParams{.temperature = 0});
  const EngineRequest r = greedy_request(1, 8);
  const DraftContext ctx{r.prompt, static_cast<int64_t>(r.prompt.size()), 4, &sampler};
  const Draft first = drafter.propose(ctx);
  ASSERT_EQ(first.tokens.size(), 4u);
  EXPECT_EQ(drafter.propose(ctx).tokens, first.tokens);
  std::vector<int32_t> longer = r.prompt;  // then the target accepts two of the drafts and adds its own token
  longer.insert(longer.end(), first.tokens.begin(), first.tokens.begin() + 2);
  longer.push_back(7);
  EXPECT_EQ(drafter.propose({longer, ctx.prompt_length, 4, &sampler}).tokens.size(), 4u);
}

TEST(SpeculativeEngine, AMissingDraftModelIsRefusedAtSubmit) {
  test::TempDir tmp;
  auto target = Gemma4Model::load(synth(tmp, "e2b-tiny", 0), Precision::F32);
  Engine engine(*target, nullptr, {}, {.max_draft_tokens = 4});
  EngineRequest r = greedy_request(0, 4);
  r.speculative = SpeculativeConfig{SpeculativeMethod::DraftModel};
  Collected c;
  SubmitResult s = engine.submit(std::move(r), c.sink());
  EXPECT_EQ(s.status, SubmitStatus::Invalid);
  EXPECT_NE(s.error.find("no draft model is loaded"), std::string::npos) << s.error;
  r = greedy_request(0, 4);
  r.speculative = SpeculativeConfig{SpeculativeMethod::Assistant};
  s = engine.submit(std::move(r), c.sink());
  EXPECT_EQ(s.status, SubmitStatus::Invalid);
  EXPECT_NE(s.error.find("assistant"), std::string::npos) << s.error;
}

// The trained demo model copies text, so prompt lookup drafts get accepted; stop strings and a JSON Schema
// constraint apply token by token exactly as without speculation.
TEST(SpeculativeEngine, TrainedModelWithStopStringsAndConstraints) {
  const std::filesystem::path dir = std::filesystem::path(QATSERVE_SOURCE_DIR) / "models/gemma4-tiny-qat";
  auto model = Gemma4Model::load(dir, Precision::BF16);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  const GenerationConfig generation = read_generation_config(dir);
  const std::string passage =
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
      "of a wife.";
  auto request = [&](const std::string& text, int64_t max_tokens) {
    EngineRequest r;
    r.prompt = tok.encode("<bos>" + text);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  };
  std::vector<EngineRequest> requests;
  requests.push_back(request(passage + "\n" + passage + "\n" + passage.substr(0, 40), 48));
  requests.push_back(request(passage + "\n" + passage.substr(0, 30), 40));
  requests.back().stop = {"fortune"};
  requests.push_back(request("say it in JSON: " + passage, 40));
  requests.back().constraint.kind = ConstraintSpec::Kind::JsonSchema;
  requests.back().constraint.schema = nlohmann::json::parse(
      R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 24}}, "required": ["a"]})");
  const EngineOptions options{.max_running = 3, .max_draft_tokens = 5};
  const Outcome plain = run_all(*model, nullptr, options, requests, &tok, generation);
  const Outcome ngram = run_all(*model, nullptr, options, with(requests, {SpeculativeMethod::Ngram, 5}), &tok, generation);
  EXPECT_EQ(ngram.tokens, plain.tokens);
  EXPECT_GT(ngram.stats.spec_accepted_tokens, 0u);
  const Outcome self = run_all(*model, model.get(), options, with(requests, {SpeculativeMethod::DraftModel, 4}), &tok,
                               generation);
  EXPECT_EQ(self.tokens, plain.tokens);
}

TEST(SpeculativeCli, GenerateGivesTheSameIdsWithNgramAndADraftModel) {
  const std::string model = std::string(QATSERVE_SOURCE_DIR) + "/models/gemma4-tiny-qat";
  const std::string base = "generate --model '" + model + "' --temperature 0 --max-tokens 40 --print-ids --prompt "
                           "'It is a truth universally acknowledged, that a single man in possession of a good fortune. "
                           "It is a truth universally acknowledged, that'";
  auto ids = [](const std::string& output) {  // the line of ids: digits and commas only
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line.find_first_not_of("0123456789,") == std::string::npos) return line;
    return std::string("no ids in: ") + output;
  };
  const test::CliResult plain = test::qatserve(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const std::string& flags :
       std::vector<std::string>{" --speculative ngram --num-speculative-tokens 6", " --draft-model '" + model + "'"}) {
    const test::CliResult spec = test::qatserve(base + flags);
    ASSERT_EQ(spec.exit_code, 0) << spec.output;
    EXPECT_EQ(ids(spec.output), ids(plain.output)) << flags;
    EXPECT_NE(spec.output.find("draft tokens accepted"), std::string::npos) << spec.output;
  }
  const test::CliResult refused = test::qatserve(base + " --speculative draft_model");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("no draft model is loaded (--draft-model DIR)"), std::string::npos) << refused.output;
}

}  // namespace qs
