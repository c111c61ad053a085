// The math of `qatserve eval` on hand-made logits whose answers are known in closed form, and its windowing.
// (Against transformers: tools/python/check_eval_external.py, ctest eval_external.)
#include "engine/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "util/error.h"

namespace qs {
namespace {

TEST(EvalMath, UniformDistributionHasPerplexityEqualToTheVocabulary) {
  std::vector<float> logits(1000, 3.5f);  // any constant: softmax is 1/1000 everywhere
  PerplexityTotals t;
  for (int32_t target : {0, 17, 999}) t.add(logits, target);
  EXPECT_NEAR(t.mean_nll(), std::log(1000.0), 1e-12);
  EXPECT_NEAR(t.perplexity(), 1000.0, 1e-9);
}

TEST(EvalMath, NegativeLogLikelihoodOfATwoWayChoice) {
  // p = softmax(0, log 3) = (1/4, 3/4).
  std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(next_token_nll(logits, 0), std::log(4.0), 1e-7);
  EXPECT_NEAR(next_token_nll(logits, 1), std::log(4.0 / 3.0), 1e-7);
  PerplexityTotals t;
  t.add(logits, 0);
  t.add(logits, 1);
  EXPECT_NEAR(t.perplexity(), std::sqrt(4.0 * 4.0 / 3.0), 1e-6);  // geometric mean of 1/p
}

TEST(EvalMath, LargeLogitsDoNotOverflow) {
  std::vector<float> logits = {1e4f, 1e4f, -1e4f};
  EXPECT_NEAR(next_token_nll(logits, 0), std::log(2.0), 1e-12);
  EXPECT_TRUE(std::isfinite(next_token_nll(logits, 2)));
  EXPECT_NEAR(next_token_nll(logits, 2), 2e4 + std::log(2.0), 1e-6);
}

TEST(EvalMath, KlOfIdenticalOrShiftedLogitsIsZero) {
  std::vector<float> a = {1.0f, -2.0f, 0.5f, 3.0f}, shifted = a;
  for (float& v : shifted) v += 7.0f;  // softmax ignores a constant shift
  EXPECT_EQ(kl_divergence(a, a), 0.0);
  EXPECT_NEAR(kl_divergence(a, shifted), 0.0, 1e-12);
}

TEST(EvalMath, KlMatchesTheClosedFormAndIsAsymmetric) {
  // p = (1/2, 1/2), q = (1/4, 3/4): KL(p||q) = 1/2 log 2 + 1/2 log(2/3); KL(q||p) = 1/4 log(1/2) + 3/4 log(3/2).
  std::vector<float> p = {0.0f, 0.0f}, q = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_NEAR(kl_divergence(q, p), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
}

TEST(EvalMath, ComparisonCountsTopOneAgreementAndTheLargestDifference) {
  ComparisonTotals c;
  c.add(std::vector<float>{0, 5, 1}, std::vector<float>{0, 4, 1.5f});  // same top token, largest diff 1
  c.add(std::vector<float>{2, 1, 0}, std::vector<float>{1, 2, -0.25f});  // top token differs
  EXPECT_EQ(c.positions, 2);
  EXPECT_EQ(c.top1_agree, 1);
  EXPECT_DOUBLE_EQ(c.top1_agreement(), 0.5);
  EXPECT_FLOAT_EQ(c.max_abs_logit_diff, 1.0);
  EXPECT_GT(c.mean_kl(), 0.0);
  EXPECT_GE(c.max_kl, c.mean_kl());
}

TEST(EvalMath, ArgmaxTakesTheFirstOfTiedMaxima) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
}

TEST(EvalWindows, CutTheTextIntoConsecutiveNonOverlappingChunks) {
  auto w = eval_windows(10, 4);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].begin, 0);
  EXPECT_EQ(w[0].end, 4);
  EXPECT_EQ(w[1].begin, 4);
  EXPECT_EQ(w[1].end, 8);
  EXPECT_EQ(w[2].begin, 8);
  EXPECT_EQ(w[2].end, 10);
  EXPECT_EQ(eval_windows(8, 4).size(), 2u);
  EXPECT_THROW(eval_windows(8, 0), Error);
}

TEST(EvalWindows, InputIsBosThenTheWindowButItsLastToken) {
  std::vector<int32_t> text = {10, 11, 12, 13, 14, 15};
  EXPECT_EQ(eval_window_input(text, {0, 4}, 2), (std::vector<int32_t>{2, 10, 11, 12}));
  EXPECT_EQ(eval_window_input(text, {4, 6}, 2), (std::vector<int32_t>{2, 14}));
  EXPECT_EQ(eval_window_input(text, {5, 6}, 2), (std::vector<int32_t>{2}));
}

TEST(EvalTokenFile, ReadsIdsSeparatedByCommasAndWhitespaceAndNamesABadItem) {
  auto dir = std::filesystem::temp_directory_path() / ("eval_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "good.txt") << "5, 6\n7 8,9\n";
  EXPECT_EQ(read_token_file(dir / "good.txt"), (std::vector<int32_t>{5, 6, 7, 8, 9}));
  std::ofstream(dir / "bad.txt") << "5 6 x7\n";
  try {
    read_token_file(dir / "bad.txt");
    ADD_FAILURE() << "no error for a bad item";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item 3 'x7'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.txt"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "empty.txt") << " \n";
  EXPECT_THROW(read_token_file(dir / "empty.txt"), Error);
  EXPECT_THROW(read_token_file(dir / "missing.txt"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qs
