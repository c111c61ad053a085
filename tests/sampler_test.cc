#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "engine/generation_config.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_for(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::vector<float> random_logits(size_t vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(vocab);
  for (float& l : out) l = normal(gen);
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

int32_t sample_once(Sampler& s, const std::vector<float>& logits, std::vector<int32_t> prompt = {},
                    std::vector<int32_t> output = {}) {
  return s.sample(logits, prompt, output).id;
}

// How often each token is drawn in n draws.
std::map<int32_t, int> histogram(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler s(params);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[sample_once(s, logits)];
  return counts;
}

// |observed - expected| within 5 standard deviations of a binomial count: fails by chance ~1e-6 per check, and with
// fixed seeds the outcome is deterministic anyway.
void expect_frequencies(const std::map<int32_t, int>& counts, const std::vector<double>& expected, int n) {
  for (size_t id = 0; id < expected.size(); ++id) {
    double p = expected[id];
    double mean = p * n, sd = std::sqrt(n * p * (1 - p));
    int got = counts.count(id) ? counts.at(id) : 0;
    if (p == 0) {
      EXPECT_EQ(got, 0) << "token " << id << " has probability 0";
    } else {
      EXPECT_NEAR(got, mean, 5 * sd + 1) << "token " << id << " expected probability " << p;
    }
  }
}

std::string validation_error(const SamplingParams& p) {
  try {
    p.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Sampler, ValidateNamesTheBadParameter) {
  auto with = [](auto edit) {
    SamplingParams p;
    edit(p);
    return validation_error(p);
  };
  EXPECT_EQ(with([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(with([](SamplingParams& p) { p.top_p = 0; }), "top_p must be in (0, 1], got 0");
  EXPECT_EQ(with([](SamplingParams& p) { p.temperature = -1; }), "temperature must be a finite number >= 0, got -1");
  EXPECT_EQ(with([](SamplingParams& p) { p.top_k = -2; }),
            "top_k must be -1 or 0 (no limit) or a positive count, got -2");
  EXPECT_EQ(with([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p must be in [0, 1], got 1.5");
  EXPECT_EQ(with([](SamplingParams& p) { p.repetition_penalty = 0; }),
            "repetition_penalty must be a finite number > 0, got 0");
  EXPECT_EQ(with([](SamplingParams& p) { p.presence_penalty = 2.5f; }), "presence_penalty must be in [-2, 2], got 2.5");
  EXPECT_EQ(with([](SamplingParams& p) { p.frequency_penalty = -3; }), "frequency_penalty must be in [-2, 2], got -3");
  EXPECT_EQ(with([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }), "logit_bias: token id must be >= 0, got -1");
  EXPECT_EQ(with([](SamplingParams& p) {
              p.logit_bias = {{7, kInf}};
            }),
            "logit_bias for token 7 must be a finite number or -inf, got inf");
  EXPECT_EQ(with([](SamplingParams& p) {
              p.logit_bias = {{7, std::nanf("")}};
            }),
            "logit_bias for token 7 must be a finite number or -inf, got nan");
  EXPECT_EQ(with([](SamplingParams& p) { p.logprobs = true, p.top_logprobs = 21; }),
            "top_logprobs must be in [0, 20], got 21");
  EXPECT_EQ(with([](SamplingParams& p) { p.top_logprobs = 3; }), "top_logprobs needs logprobs to be true");
  EXPECT_EQ(with([](SamplingParams& p) { p.logit_bias = {{7, -kInf}}, p.top_k = -1; }), "");

  SamplingParams bad;
  bad.top_p = 1.5f;
  EXPECT_THROW(Sampler{bad}, Error);  // the constructor validates
}

TEST(Sampler, RejectsInputsOutsideTheVocabulary) {
  Sampler s(seeded(1));
  std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  std::vector<int32_t> bad = {3};
  EXPECT_THROW(s.sample(logits, bad, {}), Error);
  EXPECT_THROW(s.sample(logits, {}, bad), Error);
  EXPECT_THROW(s.sample({}, {}, {}), Error);
  std::vector<float> nan_logits = {0.0f, std::nanf("")};
  EXPECT_THROW(s.sample(nan_logits, {}, {}), Error);
  SamplingParams huge;
  huge.logit_bias = {{2, 3e38f}, {2, 3e38f}};  // each finite; together past FLT_MAX
  try {
    Sampler(huge).sample(logits, {}, {});
    ADD_FAILURE() << "an infinite adjusted logit was sampled from";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "logits after logit_bias and penalties: token 2 has logit inf; expected a finite value or -inf");
  }
  SamplingParams p;
  p.logit_bias = {{3, 1.0f}};
  Sampler biased(p);
  try {
    biased.sample(logits, {}, {});
    ADD_FAILURE() << "bias outside the vocabulary accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "logit_bias: token id 3 is outside the vocabulary of 3 tokens");
  }
}

TEST(Sampler, GreedyPicksTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  auto logits = random_logits(1000, 7);
  EXPECT_EQ(sample_once(s, logits), argmax(logits));
  std::vector<float> tied = {1.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(sample_once(s, tied), 1);
}

TEST(Sampler, TopK1EqualsGreedy) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    auto logits = random_logits(5000, seed, 1.0f);
    SamplingParams p = seeded(seed);
    p.temperature = 1.5f;
    p.top_k = 1;
    Sampler s(p);
    EXPECT_EQ(sample_once(s, logits), argmax(logits)) << "seed " << seed;
  }
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  auto logits = random_logits(32768, 3, 1.0f);  // flat enough that draws vary
  auto run = [&](uint64_t seed) {
    SamplingParams p = seeded(seed);
    p.top_p = 0.9f;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(s.sample(logits, {}, out).id);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  std::set<int32_t> distinct;
  for (int32_t id : run(42)) distinct.insert(id);
  EXPECT_GT(distinct.size(), 20u);  // it really samples
}

TEST(Sampler, UnseededSamplersDrawDifferentStreams) {
  auto logits = random_logits(5000, 11, 0.1f);
  auto run = [&] {
    Sampler s(SamplingParams{});
    std::vector<int32_t> out;
    for (int i = 0; i < 16; ++i) out.push_back(sample_once(s, logits));
    return out;
  };
  EXPECT_NE(run(), run());
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const int n = 20000;
  expect_frequencies(histogram(seeded(1), logits_for(probs), n), probs, n);
}

TEST(Sampler, TemperatureFlattensAndSharpens) {
  std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  auto with_temperature = [&](double t) {  // softmax(log p / t) = p^(1/t), renormalised
    std::vector<double> q;
    double sum = 0;
    for (double p : probs) sum += std::pow(p, 1 / t);
    for (double p : probs) q.push_back(std::pow(p, 1 / t) / sum);
    return q;
  };
  const int n = 20000;
  for (float t : {0.5f, 2.0f}) {
    SamplingParams p = seeded(5);
    p.temperature = t;
    expect_frequencies(histogram(p, logits_for(probs), n), with_temperature(t), n);
  }
}

TEST(Sampler, TopPKeepsTheMinimalNucleus) {
  std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const int n = 20000;
  SamplingParams p = seeded(9);
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8: the two best tokens, renormalised
  expect_frequencies(histogram(p, logits_for(probs), n), {0.625, 0.375, 0, 0}, n);
  p.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95: three
  expect_frequencies(histogram(p, logits_for(probs), n), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n);
  p.top_p = 0.3f;  // the best token alone already exceeds it
  expect_frequencies(histogram(p, logits_for(probs), n), {1, 0, 0, 0}, n);
}

TEST(Sampler, TopPOverAWideNucleusInTheFullVocab) {
  // 1000 equally likely tokens (ids 0..999) and a small tail: the nucleus of 0.4995 is ids 0..499 (ties rank by
  // id), hundreds of tokens cut out of one bucket of equal logits.
  std::vector<float> logits(65536, -30.0f);
  std::fill(logits.begin(), logits.begin() + 1000, 0.0f);
  SamplingParams p = seeded(4);
  p.top_p = 0.4995f;
  auto counts = histogram(p, logits, 2000);
  EXPECT_LT(counts.rbegin()->first, 500);
  EXPECT_GT(counts.size(), 450u);  // spread over the whole nucleus (expected 491 distinct of 500)
}

TEST(Sampler, TopKAfterMinPThenTopP) {
  std::vector<double> probs = {0.4, 0.3, 0.2, 0.1};
  const int n = 20000;
  SamplingParams p = seeded(2);
  p.top_k = 3;
  expect_frequencies(histogram(p, logits_for(probs), n), {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0}, n);
  p.top_p = 0.7f;  // applied to the renormalised top-3: 0.444 < 0.7 <= 0.778 -> two tokens
  expect_frequencies(histogram(p, logits_for(probs), n), {4.0 / 7, 3.0 / 7, 0, 0}, n);
}

TEST(Sampler, TopKOverTheFullVocabKeepsOnlyTheBest) {
  auto logits = random_logits(262144, 21, 1.0f);
  std::vector<float> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + 63, sorted.end(), std::greater<>());
  const float kth = sorted[63];
  SamplingParams p = seeded(8);
  p.top_k = 64;
  p.temperature = 3.0f;
  auto counts = histogram(p, logits, 1000);
  for (const auto& [id, count] : counts) EXPECT_GE(logits[id], kth) << "token " << id << " is not in the top 64";
  EXPECT_GT(counts.size(), 40u);
}

TEST(Sampler, MinPCutsRelativeToTheBestTokenAfterTemperature) {
  std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const int n = 20000;
  SamplingParams p = seeded(3);
  p.min_p = 0.2f;  // keeps p >= 0.1
  expect_frequencies(histogram(p, logits_for(probs), n), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n);
  p.min_p = 0.5f;  // keeps p >= 0.25
  expect_frequencies(histogram(p, logits_for(probs), n), {0.625, 0.375, 0, 0}, n);
  // At temperature 2 the probabilities are ~sqrt(p): ratios to the best 1, 0.77, 0.55, 0.32, so min_p 0.5 keeps 3.
  p.temperature = 2.0f;
  auto counts = histogram(p, logits_for(probs), n);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts.count(3), 0u);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  EXPECT_EQ(sample_once(s, {2.0f, 1.9f}, {0}), 1);                   // 2.0 / 1.5 < 1.9, token seen in the prompt
  EXPECT_EQ(sample_once(s, {2.0f, 1.9f}, {}, {0}), 1);               // or in the output
  EXPECT_EQ(sample_once(s, {-1.0f, -1.2f}, {}, {0}), 1);             // -1.0 * 1.5 < -1.2
  EXPECT_EQ(sample_once(s, {2.0f, 1.0f}, {0, 0, 0, 0}, {0, 0}), 0);  // once per token: 1.33 > 1, not 2/1.5^6
  EXPECT_EQ(sample_once(s, {2.0f, 1.9f}), 0);                        // nothing seen: unchanged
  EXPECT_EQ(sample_once(s, {2.0f, 1.9f}, {0}), 1);                   // scratch left clean between calls: still applies
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOutputTokensOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.2f;
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {1.0f, 0.5f}, {}, {0, 0, 0}), 1);     // 1 - 3*0.2 = 0.4
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {1.0f, 0.5f}, {}, {0, 0}), 0);        // 1 - 2*0.2 = 0.6
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {1.0f, 0.5f}, {0, 0, 0, 0}, {}), 0);  // prompt: no effect
  p.frequency_penalty = 0;
  p.presence_penalty = 0.4f;
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {1.0f, 0.5f}, {}, {0, 0, 0, 0, 0}), 0);  // once: 0.6
  p.presence_penalty = 0.6f;
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {1.0f, 0.5f}, {}, {0}), 1);  // 0.4 < 0.5
  p.presence_penalty = -0.6f;                                                       // negative values encourage repeats
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), {0.5f, 1.0f}, {}, {0}), 0);
}

TEST(Sampler, LogitBiasShiftsAndMinusInfinityBans) {
  auto logits = logits_for({0.7, 0.2, 0.1});
  SamplingParams p = seeded(12);
  p.logit_bias = {{0, -kInf}};
  expect_frequencies(histogram(p, logits, 10000), {0, 2.0 / 3, 1.0 / 3}, 10000);
  p.temperature = 0;
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), logits), 1);
  p.logit_bias = {{2, 5.0f}};
  EXPECT_EQ(sample_once(*std::make_unique<Sampler>(p), logits), 2);
  p.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}};
  EXPECT_THROW(sample_once(*std::make_unique<Sampler>(p), logits), Error);
  p.temperature = 1;
  EXPECT_THROW(sample_once(*std::make_unique<Sampler>(p), logits), Error);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxAndSumToOne) {
  auto logits = random_logits(20, 5);
  SamplingParams p = seeded(6);
  p.logprobs = true;
  p.top_logprobs = 20;
  // None of these change the reported distribution: it is the model's, before sampling settings.
  p.temperature = 0.3f;
  p.logit_bias = {{3, 4.0f}};
  p.repetition_penalty = 1.3f;
  SampledToken t = Sampler(p).sample(logits, std::vector<int32_t>{1, 2}, {});
  ASSERT_EQ(t.top_logprobs.size(), 20u);
  double sum = 0, max = -kInf;
  for (float l : logits) max = std::max<double>(max, l);
  for (float l : logits) sum += std::exp(l - max);
  const double log_norm = max + std::log(sum);
  double total = 0;
  for (size_t i = 0; i < t.top_logprobs.size(); ++i) {
    auto [id, lp] = t.top_logprobs[i];
    EXPECT_NEAR(lp, logits[id] - log_norm, 1e-5);
    if (i > 0) {
      EXPECT_GE(t.top_logprobs[i - 1].second, lp);  // most likely first
    }
    total += std::exp(lp);
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_EQ(t.top_logprobs[0].first, argmax(logits));
  EXPECT_NEAR(t.logprob, logits[t.id] - log_norm, 1e-5);
}

TEST(Sampler, LogprobsOverTheFullVocabSumToOne) {
  auto logits = random_logits(262144, 9);
  SamplingParams p = seeded(6);
  p.logprobs = true;
  p.top_logprobs = 5;
  SampledToken t = Sampler(p).sample(logits, {}, {});
  double total = 0;
  for (float l : logits) total += std::exp(static_cast<double>(l) - (logits[t.id] - t.logprob));
  EXPECT_NEAR(total, 1.0, 1e-4);  // the chosen token's logprob implies the normaliser of the whole vocab
  ASSERT_EQ(t.top_logprobs.size(), 5u);
  EXPECT_EQ(t.top_logprobs[0].first, argmax(logits));
}

TEST(Sampler, NoLogprobsUnlessAsked) {
  SampledToken t = Sampler(seeded(1)).sample(std::vector<float>{0.0f, 1.0f}, {}, {});
  EXPECT_TRUE(std::isnan(t.logprob));
  EXPECT_TRUE(t.top_logprobs.empty());
}

// --- generation_config.json -----------------------------------------------------------------------------------------

TEST(SamplerGenerationConfig, MissingFileGivesGemma4ReleaseDefaults) {
  test::TempDir dir;
  GenerationConfig g = read_generation_config(dir.path());
  EXPECT_EQ(g.bos_token_id, 2);
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{1, 106, 50}));
  EXPECT_TRUE(g.is_eos(106));
  EXPECT_FALSE(g.is_eos(2));
  SamplingParams p = g.default_sampling();
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 64);
  EXPECT_EQ(p.top_p, 0.95f);
}

TEST(SamplerGenerationConfig, ReadsTheReleasedFile) {
  test::TempDir dir;
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 2, "do_sample": true,
      "eos_token_id": [1, 106, 50], "pad_token_id": 0, "temperature": 1.0, "top_k": 64, "top_p": 0.95,
      "transformers_version": "5.5.0.dev0"})";
  GenerationConfig g = read_generation_config(dir.path());
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{1, 106, 50}));
  EXPECT_EQ(g.top_k, 64);
  EXPECT_EQ(g.top_p, 0.95f);
  EXPECT_TRUE(g.do_sample);
}

TEST(SamplerGenerationConfig, AbsentFieldsAreNeutralAndDoSampleFalseIsGreedy) {
  GenerationConfig g = parse_generation_config(R"({"temperature": 0.7, "eos_token_id": 1})", "gen.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(g.bos_token_id, 2);
  SamplingParams p = g.default_sampling();
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_TRUE(parse_generation_config(R"({"do_sample": false, "temperature": 0.7})", "g").default_sampling().greedy());
  EXPECT_EQ(parse_generation_config(R"({"top_k": null})", "g").top_k, 0);
}

TEST(SamplerGenerationConfig, BadFieldsNameTheFileAndField) {
  auto error = [](std::string_view text) {
    try {
      parse_generation_config(text, "gen.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(R"({"top_p": 1.5})"), "gen.json: top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(error(R"({"top_p": "high"})"), R"(gen.json: field 'top_p' must be a number, got "high")");
  EXPECT_EQ(error(R"({"top_k": -1})"), "gen.json: field 'top_k' must be an integer >= 0, got -1");
  EXPECT_EQ(error(R"({"eos_token_id": [1, "x"]})"),
            R"(gen.json: field 'eos_token_id' must be a token id (an integer >= 0), got "x")");
  EXPECT_EQ(error(R"({"eos_token_id": []})"), "gen.json: field 'eos_token_id' must list at least one token id, got []");
  EXPECT_EQ(error(R"({"do_sample": 1})"), "gen.json: field 'do_sample' must be true or false, got 1");
  EXPECT_EQ(error("[1]"), "gen.json: expected a JSON object");
  EXPECT_NE(error("{").find("gen.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error(std::string(100, '[') + std::string(100, ']')).find("nests more than"), std::string::npos);
}

}  // namespace qs
