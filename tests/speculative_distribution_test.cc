// Sampled speculative decoding through the engine keeps the target's distribution. The trained demo model samples
// the continuation of a repeated passage many times (one seed a request, temperature 1, top-k 3, so every
// position has a few likely tokens); each generated position's token frequencies with prompt-lookup drafts
// and with the trained assistant drafter (sampled drafts, partly rejected: the residual distribution in use) are
// held against the same requests without speculation by a two-sample chi-square test (total variation printed).
// A control shows the test can fail: the same requests at temperature 0.7 are told apart. Seeds are
// fixed, so the outcome is deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/engine.h"
#include "engine/generation_config.h"
#include "engine_events.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace qs {
namespace {

constexpr int kRequests = 2000;
constexpr int64_t kTokens = 5;  // generated positions compared, the first sampled before any draft

const std::filesystem::path kModel = std::filesystem::path(QATSERVE_SOURCE_DIR) / "models/gemma4-tiny-qat";
const std::filesystem::path kAssistant = std::filesystem::path(QATSERVE_SOURCE_DIR) / "models/gemma4-tiny-qat-assistant";

struct Samples {
  std::vector<std::vector<int32_t>> tokens;  // per request
  EngineStats stats;
};

Samples sample_all(const Gemma4Model& model, const GenerationConfig& generation, EngineOptions options,
               const std::vector<int32_t>& prompt, float temperature, std::optional<SpeculativeConfig> speculative) {
  options.max_waiting = kRequests;
  Engine engine(model, nullptr, generation, options);
  std::vector<test::Collected> got(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.prompt = prompt;
    r.max_tokens = kTokens;
    r.ignore_eos = true;
    r.sampling.temperature = temperature;
    r.sampling.top_k = 3;
    r.sampling.seed = 1000 + i;
    r.speculative = speculative;
    const SubmitResult s = engine.submit(std::move(r), got[i].sink());
    EXPECT_EQ(s.status, SubmitStatus::Accepted) << s.error;
  }
  Samples run;
  for (auto& c : got) {
    c.wait();
    EXPECT_EQ(c.tokens.size(), size_t(kTokens)) << c.error;
    run.tokens.push_back(c.tokens);
  }
  run.stats = engine.stats();
  return run;
}

// The 0.99999 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty; z = 4.265).
double chi_square_bound(int df) {
  const double a = 2.0 / (9.0 * df), z = 4.265;
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

struct Comparison {
  double chi_square = 0, bound = 0, total_variation = 0;
  int df = 0;
};

// Two samples of one position's tokens, equal in size: Pearson's chi-square of homogeneity over the tokens seen at
// least 5 times in both together (the rarer ones pooled into one cell), and the total variation distance.
Comparison compare(const Samples& a, const Samples& b, int64_t position) {
  std::map<int32_t, std::pair<double, double>> counts;
  for (const auto& t : a.tokens) counts[t[position]].first += 1;
  for (const auto& t : b.tokens) counts[t[position]].second += 1;
  std::vector<std::pair<double, double>> cells;
  std::pair<double, double> rare{0, 0};
  Comparison c;
  for (auto [token, n] : counts) {
    c.total_variation += std::fabs(n.first - n.second) / (2.0 * kRequests);
    if (n.first + n.second >= 5) cells.push_back(n);
    else rare.first += n.first, rare.second += n.second;
  }
  if (rare.first + rare.second > 0) cells.push_back(rare);
  for (auto [x, y] : cells) {  // equal sample sizes: each cell's expected count is the mean of the two
    const double expected = (x + y) / 2;
    c.chi_square += (x - expected) * (x - expected) / expected + (y - expected) * (y - expected) / expected;
  }
  c.df = std::max<int>(1, static_cast<int>(cells.size()) - 1);
  c.bound = chi_square_bound(c.df);
  return c;
}

}  // namespace

TEST(SpeculativeEngine, SampledOutputKeepsTheTargetDistribution) {
  auto model = Gemma4Model::load(kModel, Precision::BF16);
  auto assistant = Gemma4Assistant::load(kAssistant, *model);
  const Tokenizer tok = Tokenizer::load(kModel / "tokenizer.json");
  const GenerationConfig generation = read_generation_config(kModel);
  const std::string passage = "Anne had not wanted this visit to Uppercross, to learn that the Crofts were to take "
                              "Kellynch Hall.";
  const std::vector<int32_t> prompt = tok.encode("<bos>" + passage + "\n" + passage + "\n" + passage.substr(0, 24));
  const EngineOptions options{.max_running = 16, .max_draft_tokens = 4, .assistant = assistant.get()};

  const Samples plain = sample_all(*model, generation, options, prompt, 1.0f, SpeculativeConfig{});
  ASSERT_EQ(plain.stats.spec_draft_tokens, 0u);
  struct Drafted {
    const char* name;
    SpeculativeConfig config;
  };
  for (const Drafted& d : {Drafted{"prompt lookup", {SpeculativeMethod::Ngram, 4}},
                           Drafted{"assistant", {SpeculativeMethod::Assistant, 4}}}) {
    const Samples spec = sample_all(*model, generation, options, prompt, 1.0f, d.config);
    // Drafts were verified, hundreds accepted and more rejected: the test reaches acceptance and the residual alike
    // (measured: prompt lookup 264 of 5,571, the assistant 2,444 of 9,799).
    EXPECT_GT(spec.stats.spec_accepted_tokens, 200u) << d.name;
    EXPECT_LT(spec.stats.spec_accepted_tokens, spec.stats.spec_draft_tokens) << d.name;
    std::printf("%s: %llu of %llu draft tokens accepted\n", d.name,
                static_cast<unsigned long long>(spec.stats.spec_accepted_tokens),
                static_cast<unsigned long long>(spec.stats.spec_draft_tokens));
    for (int64_t t = 0; t < kTokens; ++t) {
      const Comparison c = compare(spec, plain, t);
      std::printf("  position %ld: chi-square %.1f (df %d, bound %.1f), total variation %.3f\n", long(t),
                  c.chi_square, c.df, c.bound, c.total_variation);
      EXPECT_LT(c.chi_square, c.bound) << d.name << ", position " << t;
    }
  }

  // The control: a distribution that differs (temperature 0.7 against 1) fails the same test at some position.
  const Samples cooler = sample_all(*model, generation, options, prompt, 0.7f, SpeculativeConfig{});
  double worst = 0;
  for (int64_t t = 0; t < kTokens; ++t) {
    const Comparison c = compare(cooler, plain, t);
    worst = std::max(worst, c.chi_square / c.bound);
  }
  std::printf("control, temperature 0.7 against 1: largest chi-square / bound %.1f\n", worst);
  EXPECT_GT(worst, 1.0) << "the test cannot tell temperature 0.7 from 1";
}

}  // namespace qs
