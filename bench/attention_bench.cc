// Decode attention at depth, as E2B's full layers run it: one query of 8 heads over one 512-wide KV head, K and V
// in the paged cache's layout (blocks of 16 positions, [3 layers][K, V][position][row], the blocks in shuffled
// order as a long-lived pool hands them out), bf16 or int8 rows (codes, then the f32 scale). Bytes/s: K and V
// bytes read, to set beside the machine's read bandwidth (qatserve bench measures it).
//   BM_AttendSplit/DEPTH/INT8   attend_split on every thread of the pool: what a one-stream decode step runs;
//   BM_Scores, BM_WeightedV     one of its steps on one thread, over every position and dimension: where the time
//                               of the first goes (the compute rate at small depths, memory at 32K).
// The instruction set is the widest this CPU has unless QATSERVE_ISA=avx2|portable.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "formats/dtype.h"
#include "kernels/attention.h"
#include "kernels/attention_isa.h"
#include "kernels/isa.h"
#include "kernels/simd_lanes.h"
#include "util/parallel.h"

namespace {

constexpr int64_t kHeads = 8, kDim = 512, kBlock = 16, kLayers = 3;

struct PagedKv {
  std::vector<std::byte> pool;
  std::vector<qs::KvSegment> segments;
  std::vector<float> q, out, probs;
  int64_t bytes = 0;  // K and V bytes one call reads

  PagedKv(int64_t depth, bool int8) : q(kHeads * kDim), out(kHeads * kDim), probs(kHeads * depth) {
    const int64_t row = int8 ? kDim + 4 : 2 * kDim, blocks = (depth + kBlock - 1) / kBlock;
    const int64_t block_bytes = kLayers * 2 * kBlock * row;
    pool.resize(blocks * block_bytes);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0, 1);
    for (size_t i = 0; i + 2 <= pool.size(); i += 2) {
      const uint16_t b = qs::f32_to_bf16(normal(rng));
      std::memcpy(&pool[i], &b, 2);
    }
    std::vector<int64_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t b = 0; b < blocks; ++b) {
      std::byte* k = pool.data() + order[b] * block_bytes + 2 * kBlock * row;  // the middle layer
      qs::KvSegment s{k, k + kBlock * row, row, std::min(kBlock, depth - b * kBlock),
                      int8 ? qs::KvDtype::Int8 : qs::KvDtype::BF16};
      if (int8) {
        s.k_scale = s.k + kDim, s.v_scale = s.v + kDim;
        for (int64_t j = 0; j < kBlock; ++j)
          for (std::byte* scale : {k + j * row + kDim, k + (kBlock + j) * row + kDim}) {
            const float value = 0.01f + 0.001f * float(j);
            std::memcpy(scale, &value, 4);
          }
      }
      s.position = b * kBlock;
      segments.push_back(s);
    }
    for (float& x : q) x = qs::round_to_bf16(0.06f * normal(rng));
    bytes = 2 * depth * (int8 ? kDim : 2 * kDim);
  }
};

void BM_AttendSplit(benchmark::State& state) {
  PagedKv kv(state.range(0), state.range(1));
  std::vector<float> scratch;
  for (auto _ : state)
    qs::attend_split(kv.q.data(), kHeads, kDim, kv.segments, true, kv.out.data(), qs::ThreadPool::shared(), scratch);
  state.SetBytesProcessed(state.iterations() * kv.bytes);
}

bool avx512() { return qs::kernel_isa() == qs::Isa::Avx512; }

// The steps alone are the vector paths' (the portable path has none apart).
bool vector_path(benchmark::State& state) {
  if (qs::kernel_isa() != qs::Isa::Portable) return true;
  state.SkipWithError("the portable path runs attend whole: no steps to time apart");
  return false;
}

void BM_Scores(benchmark::State& state) {
  if (!vector_path(state)) return;
  PagedKv kv(state.range(0), state.range(1));
  const qs::simd::FlushDenormals canonical_rounding;
  const int64_t n = state.range(0);
  for (auto _ : state)
    (avx512() ? qs::attention::scores_avx512 : qs::attention::scores_avx2)(kv.q.data(), kHeads, kDim, kv.segments,
                                                                           true, kv.probs.data(), n);
  state.SetBytesProcessed(state.iterations() * kv.bytes / 2);  // K only
}

void BM_WeightedV(benchmark::State& state) {
  if (!vector_path(state)) return;
  PagedKv kv(state.range(0), state.range(1));
  const qs::simd::FlushDenormals canonical_rounding;
  const int64_t n = state.range(0);
  std::fill(kv.probs.begin(), kv.probs.end(), qs::round_to_bf16(1.0f / float(n)));
  for (auto _ : state)
    (avx512() ? qs::attention::weighted_v_avx512 : qs::attention::weighted_v_avx2)(
        kHeads, kDim, 0, kDim, kv.segments, true, kv.probs.data(), n, kv.out.data());
  state.SetBytesProcessed(state.iterations() * kv.bytes / 2);  // V only
}

void Depths(benchmark::internal::Benchmark* b) {
  b->ArgNames({"depth", "int8"});
  for (int64_t int8 : {0, 1})
    for (int64_t depth : {512, 4096, 32768}) b->Args({depth, int8});
  b->UseRealTime();
}
BENCHMARK(BM_AttendSplit)->Apply(Depths);
BENCHMARK(BM_Scores)->Apply(Depths);
BENCHMARK(BM_WeightedV)->Apply(Depths);

}  // namespace
