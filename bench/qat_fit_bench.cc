// Grid recovery speed per group of 32 (the repack's compute), single thread: fit_qat_group as the repack calls it
// (the AVX-512 path where the CPU has AVX-512) beside the step search alone.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "formats/dtype.h"
#include "quant/qat_grid.h"

// fit_qat_group (the AVX-512 path where the CPU has it) or the step search alone.
static void fit_groups(benchmark::State& state, qs::GroupFit (*fit_group)(std::span<const float>, std::span<int8_t>)) {
  std::mt19937 rng(1);
  const int groups = 4096;
  std::vector<float> values(groups * qs::kQatGroupSize);
  for (int g = 0; g < groups; ++g) {
    int peak = 5 + g % 4;  // peaks 5..8, as in QAT data
    float step = qs::round_to_bf16(0.001f * (1 + g % 7));
    for (int i = 0; i < qs::kQatGroupSize; ++i)
      values[g * qs::kQatGroupSize + i] =
          qs::round_to_bf16(step * (static_cast<int>(rng() % (2 * peak)) - peak));
  }
  int8_t levels[qs::kQatGroupSize];
  size_t g = 0;
  for (auto _ : state) {
    auto fit = fit_group({values.data() + g * qs::kQatGroupSize, qs::kQatGroupSize}, {levels, qs::kQatGroupSize});
    benchmark::DoNotOptimize(fit);
    g = (g + 1) % groups;
  }
  state.SetBytesProcessed(state.iterations() * qs::kQatGroupSize * 2);  // bf16 source bytes
}
static void BM_FitQatGroup(benchmark::State& state) { fit_groups(state, qs::fit_qat_group); }
static void BM_FitQatGroupSearch(benchmark::State& state) { fit_groups(state, qs::fit_qat_group_search); }
BENCHMARK(BM_FitQatGroup);
BENCHMARK(BM_FitQatGroupSearch);
