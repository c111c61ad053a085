// The thread pool's cost per parallel_for: a decode step issues hundreds of short jobs, so what a job costs beyond
// its work (waking the workers, waiting for the last chunk) bounds small matrices.
#include <benchmark/benchmark.h>

#include <atomic>

#include "util/parallel.h"

namespace {

void BM_ParallelForEmpty(benchmark::State& state) {
  std::atomic<size_t> sink{0};
  for (auto _ : state)
    qs::ThreadPool::shared().parallel_for(256, 16, [&](size_t a, size_t b) { sink.fetch_add(b - a, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_ParallelForEmpty)->UseRealTime();

// Jobs of about 20 us of work each, as a small int4 matrix of a decode step: the pool's share shows as the gap to
// the single-thread time per job.
void BM_ParallelForWork(benchmark::State& state) {
  std::atomic<uint64_t> sink{0};
  for (auto _ : state)
    qs::ThreadPool::shared().parallel_for(256, 16, [&](size_t a, size_t b) {
      uint64_t x = a;
      for (size_t i = a; i < b; ++i)
        for (int k = 0; k < 600; ++k) x = x * 6364136223846793005ull + 1442695040888963407ull;
      sink.fetch_add(x, std::memory_order_relaxed);
    });
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_ParallelForWork)->UseRealTime();

}  // namespace
