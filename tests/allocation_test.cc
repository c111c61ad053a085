// Heap allocations of a decode step, counted exactly, step by step, by replacing the global allocation functions
// for this test binary. The claim (docs/architecture.md, "The engine"): after one warm-up step, a decode step of one sequence (forward) or of
// several (forward_batch) allocates exactly one block, the logits vector it returns, plus the paged cache's
// bookkeeping where a step crosses a block boundary: a block the step completes is published in the prefix cache
// (its entry and its token list: two), and a sliding block that leaves the window goes to the cache's eviction order
// (one). Everything else (the forward pass's activations, attention's and the experts' buffers, the cache's block
// tables, the thread pool's jobs) is sized before or reused.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "synth_util.h"
#include "test_util.h"

namespace {
std::atomic<int64_t> g_allocations{0};

void* counted(std::size_t n, std::size_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace qs {
namespace {

// Allocations a step's cache bookkeeping makes as a sequence grows from `before` to `after` positions.
int64_t bookkeeping(const KvLayout& l, int64_t before, int64_t after) {
  const int64_t completed = after / l.block_size - before / l.block_size;
  const int64_t left_window = l.layers[size_t(KvClass::Sliding)] == 0 ? 0
                              : l.first_live_position(after) / l.block_size - l.first_live_position(before) / l.block_size;
  return 2 * completed + left_window;
}

std::filesystem::path synth_model(const test::TempDir& tmp, const char* preset) {
  return test::synth_quietly({.preset = preset, .format = CheckpointFormat::W4A16, .out = tmp / preset});
}

constexpr int kSteps = 100;  // past six block boundaries of 16 positions, and sliding windows of 4 across them
constexpr const char* kPresets[] = {"e2b-tiny", "26b-a4b-tiny"};  // dense with PLE and KV sharing; MoE

// Runs f on both presets in every precision (a failure names them).
template <typename F>
void for_each_model(F f) {
  test::TempDir tmp;
  for (const char* preset : kPresets) {
    const auto dir = synth_model(tmp, preset);
    for (Precision precision : {Precision::F32, Precision::BF16, Precision::Int8}) {
      SCOPED_TRACE(std::string(preset) + " " + std::string(precision_name(precision)));
      f(*Gemma4Model::load(dir, precision));
    }
  }
}

TEST(Allocations, ADecodeStepOfOneSequenceAllocatesItsLogitsAndBlockBookkeepingOnly) {
  for_each_model([](const Gemma4Model& model) {
    KvCache cache = model.new_cache(160);
    const std::vector<int32_t> ids = {2, 17, 300, 41, 5};
    model.forward(ids, cache, false);
    model.forward(std::span(ids).subspan(0, 1), cache, false);  // warm-up: buffers take the decode sizes
    for (int i = 0; i < kSteps; ++i) {
      const int64_t length = cache.length(), before = g_allocations.load();
      model.forward(std::span(ids).subspan(i % 5, 1), cache, false);
      const int64_t allocations = g_allocations.load() - before;
      ASSERT_EQ(allocations, 1 + bookkeeping(cache.layout(), length, cache.length()))
          << "step " << i << ", positions " << length << " -> " << cache.length();
    }
  });
}

TEST(Allocations, ABatchedDecodeStepAllocatesItsLogitsAndBlockBookkeepingOnly) {
  for_each_model([](const Gemma4Model& model) {
    const KvLayout layout = model.kv_layout();
    auto pool = std::make_shared<KvPool>(layout, kv_pool_for_sequences(layout, 3, 160));
    // Three sequences of different lengths and tokens (no shared prefix), each at its own block boundaries.
    std::vector<KvCache> caches;
    const std::vector<std::vector<int32_t>> prompts = {{2, 17, 300}, {9, 8, 7, 6, 5, 4, 3}, {11, 400, 12, 13, 14, 15, 16, 90, 91, 92, 93}};
    for (const auto& prompt : prompts) {
      caches.emplace_back(pool, 160);
      model.forward(prompt, caches.back(), false);
    }
    auto step = [&](int i) {
      std::vector<int32_t> next = {int32_t(20 + i % 7), int32_t(60 + i % 5), int32_t(100 + i % 3)};
      const SequenceStep steps[] = {{std::span(&next[0], 1), &caches[0]}, {std::span(&next[1], 1), &caches[1]},
                                    {std::span(&next[2], 1), &caches[2]}};
      std::vector<int64_t> lengths;
      for (const KvCache& c : caches) lengths.push_back(c.length());
      const int64_t before = g_allocations.load();
      const std::vector<float> logits = model.forward_batch(steps);
      const int64_t allocations = g_allocations.load() - before;
      int64_t expected = 1;
      for (size_t k = 0; k < caches.size(); ++k) expected += bookkeeping(layout, lengths[k], caches[k].length());
      return std::pair(allocations, expected);
    };
    step(-1);  // warm-up
    for (int i = 0; i < kSteps; ++i) {
      const auto [allocations, expected] = step(i);
      ASSERT_EQ(allocations, expected) << "step " << i;
    }
  });
}

}  // namespace
}  // namespace qs
