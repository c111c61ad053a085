// The serving engine: continuous batching gives every request exactly what it gets alone; admission, cancellation
// and drain behave.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

#include "checkpoint_tools/synth.h"
#include "engine/memory_plan.h"
#include "engine/generator.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"
#include "engine_events.h"

namespace qs {
namespace {

using test::Collected;

// Holds the engine thread inside a sink until opened: while it waits the engine takes no step, admits nothing and
// finishes nothing, so what the test does meanwhile meets a known state instead of racing the model.
class Gate {
 public:
  void pass() {  // called by the sink: the first call marks the gate reached; every call waits until it is open
    std::unique_lock lock(mu_);
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void wait_reached() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false;
};

// Opens the gate when it goes out of scope: declared after the engine, it runs before the engine's destructor
// joins the engine thread, so a failed assertion never leaves that thread held.
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.open(); }
};

// Drain's grace where the test wants everything to finish: it only stops a hung test.
constexpr auto kHangStop = std::chrono::minutes(10);

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp_ / "m"}), Precision::F32);
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

TEST_F(EngineTest, RejectsWhatCannotFit) {
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1, .max_context = 32});
  SubmitResult too_long = engine.submit(greedy(30, 0, 8), [](EngineEvent&&) { return true; });
  EXPECT_EQ(too_long.status, SubmitStatus::Invalid);
  EXPECT_NE(too_long.error.find("38 positions, but the context holds 32"), std::string::npos) << too_long.error;
}

// With one request running (held at its first token) and max_waiting queued, exactly the next one is refused.
TEST_F(EngineTest, QueueFullExactlyPastMaxWaiting) {
  constexpr int kMaxWaiting = 3;
  Gate gate;
  std::vector<Collected> got(kMaxWaiting + 2);
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1, .max_waiting = kMaxWaiting});
  OpenOnExit open{gate};
  ASSERT_EQ(engine.submit(greedy(4, 1, 20), got[0].sink([&gate] { gate.pass(); })).status, SubmitStatus::Accepted);
  gate.wait_reached();
  for (int i = 1; i <= kMaxWaiting; ++i)
    EXPECT_EQ(engine.submit(greedy(4, 1 + i, 20), got[i].sink()).status, SubmitStatus::Accepted) << "request " << i;
  EXPECT_EQ(engine.stats().waiting, kMaxWaiting);
  SubmitResult full = engine.submit(greedy(4, 9, 20), got.back().sink());
  EXPECT_EQ(full.status, SubmitStatus::QueueFull);
  EXPECT_EQ(full.error, "1 requests are running and 3 waiting");
  gate.open();
  for (int i = 0; i <= kMaxWaiting; ++i) {  // the queue empties, nothing was lost
    got[i].wait();
    EXPECT_EQ(got[i].reason, "length") << "request " << i;
    EXPECT_EQ(got[i].tokens.size(), 20u) << "request " << i;
  }
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

// Without max_context, a KV budget gives the context memory_plan's choose_max_model_len computes, and says why.
TEST_F(EngineTest, WithoutAMaxContextThePoolChoosesItAndSaysWhy) {
  const KvLayout layout = model_->kv_layout(16);
  const uint64_t bytes = 6 * layout.block_bytes(KvClass::Full) + 2 * layout.sliding_blocks_cap() * layout.block_bytes(KvClass::Sliding);
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 2, .kv_bytes = bytes});
  EXPECT_EQ(engine.max_context(), 96);
  EXPECT_EQ(engine.max_context(), choose_max_model_len(model_->config().text, layout, bytes, 2).tokens);
  EXPECT_NE(engine.max_context_reason().find("6 blocks of 16 positions"), std::string::npos) << engine.max_context_reason();
  Engine given(*model_, nullptr, GenerationConfig{}, {.max_context = 64, .kv_bytes = bytes});
  EXPECT_EQ(given.max_context_reason(), "--max-model-len 64");
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

// A sink that reports its client gone is never called again and its sequence leaves the batch at once: the engine
// takes far fewer steps than the abandoned request's 200 tokens would need.
TEST_F(EngineTest, ClientGoneFreesTheSlot) {
  std::atomic<int> events{0};
  Collected after;
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 2});
  engine.submit(greedy(4, 2, 200), [&](EngineEvent&&) { return ++events < 3; });  // hangs up after 3 events
  engine.submit(greedy(4, 3, 4), after.sink());
  after.wait();
  engine.drain(kHangStop);  // returns once nothing runs or waits
  EXPECT_EQ(after.reason, "length");
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(events.load(), 3);
  EXPECT_LT(engine.stats().steps, 200u);
}

// Requests running (held at their first token) and waiting when the server stops accepting run to their full
// length within the grace.
TEST_F(EngineTest, DrainLetsRunningAndWaitingRequestsFinish) {
  Gate gate;
  Collected running, waiting;
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1});
  OpenOnExit open{gate};
  ASSERT_EQ(engine.submit(greedy(4, 4, 40), running.sink([&gate] { gate.pass(); })).status, SubmitStatus::Accepted);
  gate.wait_reached();
  ASSERT_EQ(engine.submit(greedy(4, 5, 30), waiting.sink()).status, SubmitStatus::Accepted);
  engine.stop_accepting();
  EXPECT_EQ(engine.submit(greedy(4, 6), [](EngineEvent&&) { return true; }).status, SubmitStatus::ShuttingDown);
  EXPECT_EQ(running.tokens.size(), 1u);
  gate.open();
  engine.drain(kHangStop);
  running.wait(), waiting.wait();
  EXPECT_EQ(running.reason, "length");
  EXPECT_EQ(running.tokens.size(), 40u);
  EXPECT_EQ(waiting.reason, "length");
  EXPECT_EQ(waiting.tokens.size(), 30u);
}

// Past the grace, what still runs or waits ends with "abort": the running request is held at its first token for
// the whole grace, so it cannot have finished.
TEST_F(EngineTest, DrainAbortsWhatDoesNotFinishInTime) {
  Gate gate;
  Collected running, waiting;
  Engine engine(*model_, nullptr, GenerationConfig{}, {.max_running = 1});
  OpenOnExit open{gate};
  ASSERT_EQ(engine.submit(greedy(4, 4, 40), running.sink([&gate] { gate.pass(); })).status, SubmitStatus::Accepted);
  gate.wait_reached();
  ASSERT_EQ(engine.submit(greedy(4, 5, 30), waiting.sink()).status, SubmitStatus::Accepted);
  engine.drain(std::chrono::milliseconds(0));
  gate.open();
  running.wait(), waiting.wait();
  EXPECT_EQ(running.reason, "abort");
  EXPECT_EQ(running.tokens.size(), 1u);
  EXPECT_EQ(waiting.reason, "abort");
  EXPECT_EQ(waiting.tokens.size(), 0u);
  EXPECT_EQ(engine.submit(greedy(4, 5), [](EngineEvent&&) { return true; }).status, SubmitStatus::ShuttingDown);
}

}  // namespace qs
