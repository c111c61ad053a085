// Prompt scoring through the engine (EngineRequest::prompt_logprobs): whatever the prefill chunking, batching or
// preemption, each prompt token's logprob is the log-softmax of the whole prompt's forward pass at the position
// before it (the external check, against transformers, is ctest lm_eval_loglikelihood); max_tokens 0 scores only.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <mutex>

#include "checkpoint_tools/synth.h"
#include "engine/engine.h"
#include "engine/prompt_scores.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"

namespace qs {
namespace {

struct Scored {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<SampledToken> prompt;
  std::vector<int32_t> tokens;
  std::string reason;
  bool done = false;
  int events_with_scores = 0;

  EventSink sink() {
    return [this](EngineEvent&& e) {
      std::lock_guard lock(mu);
      if (!e.prompt_logprobs.empty()) ++events_with_scores, prompt = std::move(e.prompt_logprobs);
      for (const auto& t : e.tokens) tokens.push_back(t.id);
      if (e.finished) done = true, reason = e.finish_reason, cv.notify_all();
      return true;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

class PromptScoresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp_ / "m"}), Precision::F32);
  }
  EngineRequest scoring(int n, int32_t salt, int64_t max_tokens) {
    EngineRequest r;
    r.prompt = {2};
    for (int i = 1; i < n; ++i) r.prompt.push_back(10 + (i * 37 + salt * 11) % 4000);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.prompt_logprobs = 2;
    return r;
  }
  // log-softmax of one forward pass over the whole prompt, at each position before a token.
  std::vector<float> expected(const std::vector<int32_t>& prompt) {
    KvCache cache = model_->new_cache(static_cast<int64_t>(prompt.size()));
    std::vector<float> logits = model_->forward(prompt, cache, /*all_logits=*/true);
    const int64_t V = model_->config().text.vocab_size;
    std::vector<float> out;
    for (size_t p = 1; p < prompt.size(); ++p) {
      const float* row = logits.data() + (p - 1) * V;
      double max = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) max = std::max<double>(max, row[v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
      out.push_back(static_cast<float>(row[prompt[p]] - max - std::log(sum)));
    }
    return out;
  }
  test::TempDir tmp_;
  std::unique_ptr<Gemma4Model> model_;
};

}  // namespace

TEST_F(PromptScoresTest, ChunkedBatchedAndPreemptedScoresEqualOneForwardPass) {
  const KvLayout layout = model_->kv_layout(4);
  const uint64_t bytes = 15 * layout.block_bytes(KvClass::Full) + 8 * layout.block_bytes(KvClass::Sliding);
  Engine engine(*model_, nullptr, GenerationConfig{},
                {.max_running = 4, .prefill_chunk = 5, .max_context = 48, .kv_bytes = bytes, .kv_block_size = 4});
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(scoring(12 + i, i, i == 0 ? 0 : 20));
  std::vector<Scored> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(engine.submit(reqs[i], got[i].sink()).status, SubmitStatus::Accepted);
  for (size_t i = 0; i < reqs.size(); ++i) {
    got[i].wait();
    EXPECT_EQ(got[i].reason, "length");
    EXPECT_EQ(got[i].events_with_scores, 1) << "request " << i;
    const std::vector<float> want = expected(reqs[i].prompt);
    ASSERT_EQ(got[i].prompt.size(), want.size()) << "request " << i;
    for (size_t p = 0; p < want.size(); ++p) {
      EXPECT_EQ(got[i].prompt[p].id, reqs[i].prompt[p + 1]);
      EXPECT_NEAR(got[i].prompt[p].logprob, want[p], 1e-5) << "request " << i << " position " << p + 1;
      ASSERT_EQ(got[i].prompt[p].top_logprobs.size(), 2u);
      EXPECT_GE(got[i].prompt[p].top_logprobs[0].second, got[i].prompt[p].logprob - 1e-6f);
    }
  }
  EXPECT_TRUE(got[0].tokens.empty());  // max_tokens 0: scored, nothing generated
  EXPECT_EQ(got[1].tokens.size(), 20u);
  EXPECT_GT(engine.stats().preemptions, 0u);
}

TEST_F(PromptScoresTest, ScoringAdoptsNoPrefixButPublishesItsBlocks) {
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 2, .prefill_chunk = 3});
  EngineRequest r = scoring(40, 5, 1);
  Scored first, second, plain;
  engine.submit(r, first.sink());
  first.wait();
  engine.submit(r, second.sink());
  second.wait();
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 0);  // a scoring request computes every position
  ASSERT_EQ(second.prompt.size(), first.prompt.size());
  for (size_t p = 0; p < first.prompt.size(); ++p) EXPECT_EQ(second.prompt[p].logprob, first.prompt[p].logprob);
  r.prompt_logprobs.reset();
  engine.submit(r, plain.sink());
  plain.wait();
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 32);  // its two complete blocks of 16 were published
  EXPECT_EQ(plain.tokens, first.tokens);
}

TEST(PromptScores, ScoreTokenIsTheLogSoftmaxWithItsBestAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f};
  const double norm = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0));
  SampledToken t = score_token(logits, 0, 3);
  EXPECT_NEAR(t.logprob, 1.0 - norm, 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);  // ties by id
  EXPECT_EQ(t.top_logprobs[1].first, 2);
  EXPECT_EQ(t.top_logprobs[2].first, 0);
  EXPECT_NEAR(t.top_logprobs[0].second, 3.0 - norm, 1e-6);
  EXPECT_TRUE(score_token(logits, 3, 0).top_logprobs.empty());
}

TEST(PromptScores, MaxTokensZeroNeedsScoring) {
  test::TempDir tmp;
  auto model = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp / "m"}), Precision::F32);
  Engine engine(*model, nullptr, GenerationConfig{}, {});
  EngineRequest r;
  r.prompt = {2, 10, 11};
  r.max_tokens = 0;
  EXPECT_EQ(engine.submit(r, [](EngineEvent&&) { return true; }).status, SubmitStatus::Invalid);
  r.prompt_logprobs = 21;
  EXPECT_EQ(engine.submit(r, [](EngineEvent&&) { return true; }).status, SubmitStatus::Invalid);
}

}  // namespace qs
