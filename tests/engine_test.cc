// The serving engine: continuous batching gives every request exactly what it gets alone; admission, cancellation
// and drain behave.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

#include "checkpoint_tools/synth.h"
#include "engine/generator.h"
#include "model/gemma4.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string reason;
  bool done = false;

  EventSink sink() {
    return [this](EngineEvent&& e) {
      std::lock_guard lock(mu);
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

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.preset = "e2b-tiny";
    o.out = tmp_ / "m";
    o.progress = false;
    synth_checkpoint(o);
    model_ = Gemma4Model::load(o.out, Precision::F32);
  }
  EngineRequest greedy(int n, int32_t salt, int64_t max_tokens = 12) {
    EngineRequest r;
    r.prompt = {2};
    for (int i = 1; i < n; ++i) r.prompt.push_back(10 + (i * 31 + salt * 7) % 4000);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }
  std::vector<int32_t> alone(const EngineRequest& r) {
    Generator gen(*model_, nullptr, GenerationConfig{});
    GenerationRequest g{r.prompt, r.max_tokens, r.sampling, {}, {}, true};
    std::vector<int32_t> ids;
    for (const auto& t : gen.run(g).tokens) ids.push_back(t.id);
    return ids;
  }
  test::TempDir tmp_;
  std::unique_ptr<Gemma4Model> model_;
};

}  // namespace

TEST_F(EngineTest, BatchedRequestsEqualSoloRuns) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(greedy(3 + 2 * i, i));  // prompts longer than the window and the chunk
  std::vector<Collected> got(reqs.size());  // outlives the engine, which may still deliver to it
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 8, .prefill_chunk = 5});
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(engine.submit(reqs[i], got[i].sink()).status, SubmitStatus::Accepted);
  for (size_t i = 0; i < reqs.size(); ++i) {
    got[i].wait();
    EXPECT_EQ(got[i].reason, "length");
    EXPECT_EQ(got[i].tokens, alone(reqs[i])) << "request " << i;
  }
}

TEST_F(EngineTest, RejectsWhatCannotFitAndWhenFull) {
  std::vector<Collected> got(3);
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1, .max_waiting = 1, .max_context = 32});
  SubmitResult too_long = engine.submit(greedy(30, 0, 8), [](EngineEvent&&) { return true; });
  EXPECT_EQ(too_long.status, SubmitStatus::Invalid);
  EXPECT_NE(too_long.error.find("38 positions, but the context holds 32"), std::string::npos) << too_long.error;
  int accepted = 0, full = 0;
  for (auto& c : got) {
    auto r = engine.submit(greedy(4, 1, 20), c.sink());
    accepted += r.status == SubmitStatus::Accepted;
    full += r.status == SubmitStatus::QueueFull;
  }
  EXPECT_GE(accepted, 1);
  EXPECT_GE(full + accepted, 3);
}

// A pool with room for about one and a half of the four sequences: the youngest running ones are preempted and
// recompute later, and every request still gets exactly what it gets alone.
TEST_F(EngineTest, PreemptsTheYoungestWhenThePoolRunsDry) {
  const KvLayout layout = model_->kv_layout(4);
  const uint64_t bytes = 15 * layout.block_bytes(KvClass::Full) + 8 * layout.block_bytes(KvClass::Sliding);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy(10, 20 + i, 30));
  std::vector<Collected> got(reqs.size());
  Engine engine(*model_, nullptr, GenerationConfig{},
                {.max_running = 4, .prefill_chunk = 8, .max_context = 48, .kv_bytes = bytes, .kv_block_size = 4});
  EXPECT_EQ(engine.stats().kv_blocks_total, 15 + 8);
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(engine.submit(reqs[i], got[i].sink()).status, SubmitStatus::Accepted);
  for (size_t i = 0; i < reqs.size(); ++i) {
    got[i].wait();
    EXPECT_EQ(got[i].reason, "length");
    EXPECT_EQ(got[i].tokens, alone(reqs[i])) << "request " << i;
  }
  EXPECT_GT(engine.stats().preemptions, 0u);
}

TEST_F(EngineTest, AContextBeyondThePoolIsRefusedWithTheNumbers) {
  const KvLayout layout = model_->kv_layout(4);
  const uint64_t bytes = 6 * layout.block_bytes(KvClass::Full) + 2 * layout.block_bytes(KvClass::Sliding);
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1, .kv_bytes = bytes, .kv_block_size = 4});
  EXPECT_EQ(engine.max_context(), 24);
  SubmitResult r = engine.submit(greedy(20, 0, 8), [](EngineEvent&&) { return true; });
  EXPECT_EQ(r.status, SubmitStatus::Invalid);
  EXPECT_NE(r.error.find("28 positions, but the context holds 24 (all that the KV pool holds"), std::string::npos)
      << r.error;
  EXPECT_THROW(Engine(*model_, nullptr, GenerationConfig{}, {.kv_bytes = 100}), Error);
}

TEST_F(EngineTest, ASecondRequestWithTheSamePromptAdoptsItsCachedBlocks) {
  Collected first, second;
  // Prefill chunks shorter than the tiny window, as the real models' are: see kv_cache_test.cc.
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 2, .prefill_chunk = 3});
  const EngineRequest r = greedy(40, 5, 6);
  engine.submit(r, first.sink());
  first.wait();
  engine.submit(r, second.sink());
  second.wait();
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 32);  // the prompt's two complete blocks of 16
}

TEST_F(EngineTest, ClientGoneFreesTheSlot) {
  std::atomic<int> events{0};
  Collected after;
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 2});
  engine.submit(greedy(4, 2, 200), [&](EngineEvent&&) { return ++events < 3; });  // hangs up after 3 events
  engine.submit(greedy(4, 3, 4), after.sink());
  after.wait();
  for (int i = 0; i < 100 && engine.stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(events.load(), 3);
}

TEST_F(EngineTest, DrainAbortsWhatDoesNotFinishInTime) {
  Collected c;
  auto engine = std::make_unique<Engine>(*model_, nullptr, GenerationConfig{}, EngineOptions{});
  engine->submit(greedy(4, 4, 4000), c.sink());
  engine->drain(std::chrono::milliseconds(50));
  c.wait();
  EXPECT_EQ(c.reason, "abort");
  EXPECT_EQ(engine->submit(greedy(4, 5), [](EngineEvent&&) { return true; }).status, SubmitStatus::ShuttingDown);
}

}  // namespace qs
