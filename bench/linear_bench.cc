// Linear layers over in-place weights: int4 W4A16 and bf16, shapes of E2B's MLP (6144 x 1536), activations f32
// (reference path) or bf16 (serving path). BM_*: one weight matrix (5-19 MB) that stays in cache, so the kernel's
// compute rate. BM_FromMemory_*: one token through 100 distinct matrices (470 MB int4, far past the 260 MB L3), so
// what decode sees: compute and memory together.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "formats/dtype.h"
#include "kernels/linear.h"
#include "util/parallel.h"

namespace {

struct Weights {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, bf16;
  qs::LinearWeight int4, dense;
  Weights(int64_t out, int64_t in) : words(out * in / 8), scales(out * in / 32), bf16(out * in) {
    std::mt19937 rng(1);
    for (auto& w : words) w = rng();
    for (auto& s : scales) s = qs::f32_to_bf16(0.001f * (1 + rng() % 7));
    for (auto& v : bf16) v = qs::f32_to_bf16(0.01f * (static_cast<int>(rng() % 16) - 8));
    int4 = {out, in, qs::WeightKind::Int4, reinterpret_cast<const std::byte*>(words.data()),
            reinterpret_cast<const std::byte*>(scales.data()), 32};
    dense = {out, in, qs::WeightKind::BF16, reinterpret_cast<const std::byte*>(bf16.data())};
  }
};

void run(benchmark::State& state, bool int4, qs::Activations activations, int64_t out = 6144) {
  const int64_t in = 1536, T = state.range(0);
  static Weights big(6144, in), small(1024, in);
  const Weights& w = out == 6144 ? big : small;
  const qs::LinearWeight& lw = int4 ? w.int4 : w.dense;
  std::vector<float> x(T * in, 0.5f), y(T * out);
  for (auto _ : state) qs::linear_forward(lw, x.data(), T, y.data(), qs::ThreadPool::shared(), activations);
  state.SetBytesProcessed(state.iterations() * lw.bytes());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * out * in * T * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// Weights int4 or bf16; activations f32 (the reference path) or bf16 (vdpbf16ps, the serving default).
void BM_Int4_F32(benchmark::State& s) { run(s, true, qs::Activations::F32); }
void BM_Int4_Bf16(benchmark::State& s) { run(s, true, qs::Activations::BF16); }
void BM_Bf16_F32(benchmark::State& s) { run(s, false, qs::Activations::F32); }
void BM_Bf16_Bf16(benchmark::State& s) { run(s, false, qs::Activations::BF16); }
// 1024 x 1536 int4 (0.9 MB): each core's half stays in its 2 MB L2, so the kernel's own compute rate. (The
// 6144-row matrix lives in the L3, which feeds a core here hardly faster than memory.)
void BM_InL2_Int4_Bf16(benchmark::State& s) { run(s, true, qs::Activations::BF16, 1024); }
// Decode as the model sees it: every call reads a matrix that left the caches long ago.
void from_memory(benchmark::State& state, bool int4) {
  static constexpr int64_t out = 6144, in = 1536, mats = 100;
  static std::vector<Weights>* all = [] {
    auto* v = new std::vector<Weights>;
    v->reserve(mats);
    for (int64_t m = 0; m < mats; ++m) v->emplace_back(out, in);
    return v;
  }();
  std::vector<float> x(in, 0.5f), y(out);
  int64_t k = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    const qs::LinearWeight& w = int4 ? (*all)[k % mats].int4 : (*all)[k % mats].dense;
    qs::linear_forward(w, x.data(), 1, y.data(), qs::ThreadPool::shared(), qs::Activations::BF16);
    bytes += w.bytes();
    ++k;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["Gweights/s"] = benchmark::Counter(double(out) * in * k, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
void BM_FromMemory_Int4(benchmark::State& s) { from_memory(s, true); }
void BM_FromMemory_Bf16(benchmark::State& s) { from_memory(s, false); }
BENCHMARK(BM_FromMemory_Int4)->UseRealTime();
BENCHMARK(BM_FromMemory_Bf16)->UseRealTime();

BENCHMARK(BM_InL2_Int4_Bf16)->Arg(1)->Arg(4)->Arg(8)->Arg(128)->UseRealTime();
BENCHMARK(BM_Int4_F32)->Arg(1)->Arg(4)->Arg(16)->Arg(128)->UseRealTime();
BENCHMARK(BM_Int4_Bf16)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Arg(128)->Arg(512)->UseRealTime();
BENCHMARK(BM_Bf16_F32)->Arg(1)->Arg(16)->UseRealTime();
BENCHMARK(BM_Bf16_Bf16)->Arg(1)->Arg(16)->Arg(128)->UseRealTime();

}  // namespace
