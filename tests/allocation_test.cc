// No allocation in the decode loop: once its buffers have their sizes, a decode step allocates nothing but the
// logits it returns (and, now and then, room for a longer context) (the thread pool borrows its jobs; the forward pass, the kernels and the attention reuse their
// buffers). Counted by replacing the global allocation functions for this test binary.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
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

TEST(Allocations, ADecodeStepAllocatesOnlyTheLogitsItReturns) {
  for (Precision precision : {Precision::BF16, Precision::Int8}) {
    for (const char* preset : {"e2b-tiny", "26b-a4b-tiny"}) {
      test::TempDir tmp;
      SynthOptions o;
      o.preset = preset;
      o.format = CheckpointFormat::W4A16;
      o.out = tmp / "m";
      o.progress = false;
      synth_checkpoint(o);
      auto model = Gemma4Model::load(o.out, precision);
      KvCache cache = model->new_cache(160);
      std::vector<int32_t> ids = {2, 17, 300, 41, 5};
      model->forward(ids, cache, false);
      for (int i = 0; i < 20; ++i) model->forward(std::span(ids).subspan(i % 5, 1), cache, false);  // sizes settle
      constexpr int kSteps = 64;
      const int64_t before = g_allocations.load();
      for (int i = 0; i < kSteps; ++i) model->forward(std::span(ids).subspan(i % 5, 1), cache, false);
      const int64_t allocations = g_allocations.load() - before;
      // The logits each step returns; the paged cache's bookkeeping when a step completes a 16-position block
      // (its prefix entry) or a sliding block leaves the window; and the doubling of the few buffers whose size
      // follows the context. Never one per layer or per linear.
      EXPECT_LE(allocations, kSteps * 3 / 2) << preset << " " << precision_name(precision) << ": " << allocations
                                             << " allocations in " << kSteps << " steps";
    }
  }
}

}  // namespace
}  // namespace qs
