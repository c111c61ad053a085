// Linear layers as the model runs them: int4 weights in the kernels' tiled layout (copied at load), bf16 weights in
// place; E2B's q_proj shape 2048 x 1536; activations bf16 (the default), f32 (the parity reference) or int8 (the
// opt-in W4A8 mode). Two regimes, never mixed in one row:
//   BM_InCache_*    one 1.8 MB int4 matrix that stays in the caches: the kernel's compute rate, tokens 1 to 128;
//   BM_FromMemory_* one token through 1 GB of distinct int4 matrices (twice the 480 MB L3) or 2 GB of bf16: what
//                   a decode step sees, to set beside the machine's read bandwidth (qatserve bench measures it);
//                   _Shape: the same for each of E2B's int4 linear shapes, 256 MB of each; _Paired: each 256 MB
//                   beside a 256 MB read sweep taken just before it, for a ratio to the bandwidth of that moment.
// The instruction set is the widest this CPU has unless QATSERVE_ISA=avx2|portable; QATSERVE_BF16_DOT=0|1 runs
// AVX-512's f32 FMA path or its bf16 dot products instead of the measured choice, QATSERVE_INT4_LAYOUT=tiles|
// columns|blocks|lanes the int4 layout instead of the one a model loaded for those activations gets (the same
// bits, for A/B runs in one binary).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "util/bandwidth.h"
#include "util/huge_buffer.h"
#include "util/parallel.h"

namespace {

constexpr int64_t kOut = 2048, kIn = 1536;

struct Weights {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, bf16;
  qs::HugeBuffer tiles;
  qs::LinearWeight int4, dense;
  Weights(int64_t out, int64_t in, bool with_bf16, qs::Int4Layout layout)
      : words(out * in / 8), scales(out * in / 32), bf16(with_bf16 ? out * in : 0) {
    std::mt19937 rng(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(this)));
    for (auto& w : words) w = rng();
    for (auto& s : scales) s = qs::f32_to_bf16(0.001f * (1 + rng() % 7));
    for (auto& v : bf16) v = qs::f32_to_bf16(0.01f * (static_cast<int>(rng() % 16) - 8));
    const qs::LinearWeight rows{out, in, qs::WeightKind::Int4, reinterpret_cast<const std::byte*>(words.data()),
                                reinterpret_cast<const std::byte*>(scales.data()), 32};
    int4 = qs::tiled(rows, tiles, qs::ThreadPool::shared(), layout);
    words = {}, scales = {};
    dense = {out, in, qs::WeightKind::BF16, reinterpret_cast<const std::byte*>(bf16.data())};
  }
};

void pick_isa() {
  static const bool picked = [] {
    if (const char* isa = std::getenv("QATSERVE_ISA")) qs::set_kernel_isa(qs::parse_isa(isa));
    if (const char* dot = std::getenv("QATSERVE_BF16_DOT"))
      qs::set_bf16_multiply(std::string(dot) == "0" ? qs::Bf16Multiply::Fma : qs::Bf16Multiply::DotProducts);
    return true;
  }();
  (void)picked;
}

qs::Int4Layout layout_for(qs::Activations activations) {
  pick_isa();
  if (const char* name = std::getenv("QATSERVE_INT4_LAYOUT"))
    for (auto layout : {qs::Int4Layout::Tiles, qs::Int4Layout::Columns, qs::Int4Layout::Blocks, qs::Int4Layout::Lanes})
      if (std::string(name) == qs::int4_layout_name(layout)) return layout;
  return qs::fastest_int4_layout(activations);
}

void in_cache(benchmark::State& state, qs::Activations activations) {
  pick_isa();
  const int64_t T = state.range(0);
  static std::array<std::unique_ptr<Weights>, 3> made;  // one per activations: each gets its layout
  auto& mine = made[static_cast<int>(activations)];
  if (!mine) mine = std::make_unique<Weights>(kOut, kIn, false, layout_for(activations));
  const Weights& w = *mine;
  std::vector<float> x(T * kIn, 0.5f), y(T * kOut);
  for (auto _ : state) qs::linear_forward(w.int4, x.data(), T, y.data(), qs::ThreadPool::shared(), activations);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kOut * kIn * T * state.iterations(), benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}
void BM_InCache_Bf16(benchmark::State& s) { in_cache(s, qs::Activations::BF16); }
void BM_InCache_F32(benchmark::State& s) { in_cache(s, qs::Activations::F32); }
void BM_InCache_Int8(benchmark::State& s) { in_cache(s, qs::Activations::Int8); }
BENCHMARK(BM_InCache_Bf16)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(5)->Arg(6)->Arg(7)->Arg(8)->Arg(16)->Arg(128)->UseRealTime();
BENCHMARK(BM_InCache_F32)->Arg(1)->Arg(128)->UseRealTime();
BENCHMARK(BM_InCache_Int8)->Arg(1)->Arg(4)->Arg(5)->Arg(6)->Arg(7)->Arg(8)->Arg(16)->Arg(128)->UseRealTime();

// One token per call, each call a matrix that left the caches long ago.
void from_memory(benchmark::State& state, bool int4, qs::Activations activations) {
  pick_isa();
  const qs::Int4Layout layout = layout_for(activations);
  auto pool = [&](int64_t mats, bool bf16) {
    auto* v = new std::deque<Weights>;
    for (int64_t m = 0; m < mats; ++m) v->emplace_back(kOut, kIn, bf16, layout);
    return v;
  };
  // 1.06 GB of tiled int4 per layout; 2.0 GB of bf16
  static std::deque<Weights>*int4_pools[5] = {}, *bf16_pool = nullptr;  // one per layout
  auto*& made = int4 ? int4_pools[static_cast<int>(layout)] : bf16_pool;
  if (!made) made = int4 ? pool(600, false) : pool(320, true);
  std::deque<Weights>& all = *made;
  const int64_t mats = static_cast<int64_t>(all.size());
  std::vector<float> x(kIn, 0.5f), y(kOut);
  int64_t k = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    const qs::LinearWeight& w = int4 ? all[k % mats].int4 : all[k % mats].dense;
    qs::linear_forward(w, x.data(), 1, y.data(), qs::ThreadPool::shared(), activations);
    bytes += w.bytes();
    ++k;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["Gweights/s"] = benchmark::Counter(double(kOut) * kIn * k, benchmark::Counter::kIsRate,
                                                    benchmark::Counter::kIs1000);
}
// Paired with the machine's read bandwidth: on a shared host it can move between ~30 and ~55 GB/s within a second,
// so a best-of sweep taken apart from a kernel's average says little. Each iteration reads 256 MB by the sweep
// (util/bandwidth.h), then 256 MB of 1 GB of int4 matrices (out x in) one token each; the counters are medians over
// the pairs, each pair ~15 ms long and so mostly within one state of the host.
void BM_FromMemory_Int4_Bf16_Paired(benchmark::State& state) {
  pick_isa();
  const int64_t out = state.range(0), in = state.range(1);
  std::deque<Weights> all;  // 1 GB of matrices or more, far past the L3
  for (uint64_t made = 0; made < (1ull << 30); made += uint64_t(out) * in * 9 / 16)
    all.emplace_back(out, in, false, layout_for(qs::Activations::BF16));
  qs::ThreadPool& pool = qs::ThreadPool::shared();
  qs::ReadSweep sweep(pool, 256ull << 20);
  std::vector<float> x(in, 0.5f), y(out);
  std::vector<double> sweeps, kernels, ratios;
  size_t k = 0;
  for (auto _ : state) {
    const double swept = sweep.pass();
    uint64_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (bytes < sweep.bytes()) {
      const qs::LinearWeight& w = all[k++ % all.size()].int4;
      qs::linear_forward(w, x.data(), 1, y.data(), pool, qs::Activations::BF16);
      bytes += w.bytes();
    }
    const double read = bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sweeps.push_back(swept / 1e9), kernels.push_back(read / 1e9), ratios.push_back(read / swept);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  state.counters["sweep_GB/s"] = median(sweeps);
  state.counters["kernel_GB/s"] = median(kernels);
  state.counters["kernel/sweep"] = median(ratios);
  // The kernel while the host reads fast: the pairs whose sweep came within 20% of the fastest one.
  const double fastest = *std::max_element(sweeps.begin(), sweeps.end());
  std::vector<double> fast;
  for (size_t i = 0; i < sweeps.size(); ++i)
    if (sweeps[i] >= 0.8 * fastest) fast.push_back(kernels[i]);
  state.counters["kernel_GB/s_fast_sweeps"] = median(fast);
  state.counters["fast_sweeps"] = double(fast.size());
}
BENCHMARK(BM_FromMemory_Int4_Bf16_Paired)
    ->ArgNames({"out", "in"})
    ->Args({kOut, kIn})
    ->Args({262144, 1536})  // E2B's LM head: one call of 200 MB
    ->Iterations(60)
    ->UseRealTime();

// One token through each of E2B's int4 linear shapes (out x in), each call a matrix that left the caches: how far
// below the big matrices' rate a decode step's many small calls run (their start and end in every thread).
void BM_FromMemory_Int4_Bf16_Shape(benchmark::State& state) {
  pick_isa();
  const int64_t out = state.range(0), in = state.range(1);
  const uint64_t bytes = uint64_t(out) * in / 2 + uint64_t(out) * in / 16;
  std::deque<Weights> all;
  for (uint64_t made = 0; made < (256ull << 20); made += bytes)
    all.emplace_back(out, in, false, layout_for(qs::Activations::BF16));
  std::vector<float> x(in, 0.5f), y(out);
  size_t k = 0;
  for (auto _ : state) {
    qs::linear_forward(all[k % all.size()].int4, x.data(), 1, y.data(), qs::ThreadPool::shared(), qs::Activations::BF16);
    ++k;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes * k));
}
BENCHMARK(BM_FromMemory_Int4_Bf16_Shape)
    ->ArgNames({"out", "in"})
    ->Args({256, 1536})      // k_proj, v_proj, per-layer input gate
    ->Args({1536, 256})      // per-layer projection
    ->Args({2048, 1536})     // q_proj
    ->Args({1536, 2048})     // o_proj
    ->Args({6144, 1536})     // gate_proj, up_proj
    ->Args({1536, 6144})     // down_proj
    ->Args({12288, 1536})    // gate_proj, up_proj of the double-wide layers
    ->Args({1536, 12288})    // their down_proj
    ->Args({262144, 1536})   // the tied LM head
    ->UseRealTime()
    ->MinTime(1.0);

void BM_FromMemory_Int4_Bf16(benchmark::State& s) { from_memory(s, true, qs::Activations::BF16); }
void BM_FromMemory_Int4_Int8(benchmark::State& s) { from_memory(s, true, qs::Activations::Int8); }
void BM_FromMemory_Bf16Weights(benchmark::State& s) { from_memory(s, false, qs::Activations::BF16); }
BENCHMARK(BM_FromMemory_Int4_Bf16)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_FromMemory_Int4_Int8)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_FromMemory_Bf16Weights)->UseRealTime()->MinTime(1.0);

}  // namespace
