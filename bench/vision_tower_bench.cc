// Encode time of one image through the full-size vision towers: E2B's (configs/e2b.json: 16 layers of 768, MLP
// 3072, clipped linears) and 26B-A4B's (configs/26b-a4b.json: 27 layers of 1152, MLP 4304, standardized), on
// synthetic weights that `synth --towers-only` writes once per preset and format into the temporary directory
// (w4a16: the tower linears int4 but the embedder's projection and, on 26B, the down projections, whose 4304
// inputs are no whole number of groups; bf16: every linear bf16), bf16 activations. The image is a full patch
// grid of `soft tokens` x pooling^2 patches (280: the processor's default budget, 2520 patches), random pixels.
// Counters: soft tokens/s, patches/s, GFLOP/s and the fraction of the machine's f32 FMA peak, measured in the same
// process (every thread of the pool running independent FMA chains on registers, per second of its own CPU time:
// peak_fma_flops_per_thread()). The fraction is FLOPs over (CPU seconds of every thread x that peak), so a shared
// machine's load, which stretches wall time, does not change it much.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <time.h>
#include <filesystem>
#include <random>
#include <vector>

#include "checkpoint_tools/synth.h"
#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/isa.h"
#include "model/gemma4_vision.h"
#include "util/parallel.h"

namespace {

namespace fs = std::filesystem;

const char* kPresets[] = {"e2b", "26b-a4b"};

fs::path synthetic_tower(const std::string& preset, bool w4a16) {
  const fs::path dir = fs::temp_directory_path() / ("qatserve-vision-bench-" + preset + (w4a16 ? "-w4a16" : "-bf16"));
  if (fs::exists(dir / "config.json")) return dir;
  qs::SynthOptions o;
  o.preset = preset;
  o.format = w4a16 ? qs::CheckpointFormat::W4A16 : qs::CheckpointFormat::Bf16;
  o.towers_only = true;
  o.out = dir;
  o.progress = false;
  qs::synth_checkpoint(o);
  return dir;
}

// FLOPs of one image of `patches` patches (multiply-adds count 2): every linear over every patch, attention scores
// and their weighted sum over all patch pairs, the embedder's projection of the pooled soft tokens.
double image_flops(const qs::Gemma4VisionConfig& v, int64_t text_hidden, int64_t patches) {
  const double D = double(v.hidden_size), I = double(v.intermediate_size), P = double(patches);
  const double q = double(v.num_attention_heads * v.head_dim), kv = double(v.num_key_value_heads * v.head_dim);
  const double per_patch_layer = D * q + 2 * D * kv + q * D + 3 * D * I;
  const double attention = 2 * P * P * q;  // q.k and p.v
  const double soft = P / double(v.pooling_kernel_size * v.pooling_kernel_size);
  return 2 * (P * double(v.patch_values()) * D + v.num_hidden_layers * (P * per_patch_layer + attention) +
              soft * D * double(text_hidden));
}

// f32 FMA peak of this machine: each pool thread runs 12 independent chains of 16-lane (AVX-512) or 8-lane (AVX2)
// fused multiply-adds on registers (2.4e8 instructions); the best of three.
__attribute__((target("avx512f"))) double fma_chains_avx512(int64_t n) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < n; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  float sum = 0;
  for (int i = 0; i < 12; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return double(n) * 12 * 16 * 2 + sum * 1e-30;
}
__attribute__((target("avx2,fma"))) double fma_chains_avx2(int64_t n) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < n; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float lanes[8], sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float x : lanes) sum += x;
  }
  return double(n) * 12 * 8 * 2 + sum * 1e-30;
}

// Per thread of CPU time (CLOCK_THREAD_CPUTIME_ID), so that a loaded machine, which gives the process only part
// of its cores, does not lower it; times the pool's thread count for the whole machine.
double peak_fma_flops_per_thread() {
  static const double peak = [] {
    qs::ThreadPool& pool = qs::ThreadPool::shared();
    const bool avx512 = qs::cpu_has(qs::Isa::Avx512);
    const int64_t n = 20'000'000;
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      std::vector<double> rate(pool.size());
      pool.parallel_for(pool.size(), 1, [&](size_t first, size_t last) {
        for (size_t i = first; i < last; ++i) {
          timespec t0{}, t1{};
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
          const double flops = avx512 ? fma_chains_avx512(n) : fma_chains_avx2(n);
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
          rate[i] = flops / (double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec));
        }
      });
      for (double r : rate) best = std::max(best, r);
    }
    return best;
  }();
  return peak;
}

// A full grid of soft_tokens cells, each k x k patches, as wide as it is tall or one cell wider.
qs::ImagePatches test_image(const qs::Gemma4VisionConfig& v, int64_t soft_tokens, std::vector<float>& pixels,
                            std::vector<int32_t>& positions) {
  int64_t rows = 1;
  while ((rows + 1) * (rows + 1) <= soft_tokens) ++rows;
  while (soft_tokens % rows) --rows;
  const int64_t k = v.pooling_kernel_size, width = soft_tokens / rows * k, height = rows * k;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  pixels.resize(width * height * v.patch_values());
  for (float& p : pixels) p = unit(rng);
  positions.clear();
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) positions.insert(positions.end(), {int32_t(x), int32_t(y)});
  return {pixels, positions};
}

void BM_VisionTowerEncode(benchmark::State& state) {
  const std::string preset = kPresets[state.range(0)];
  const bool w4a16 = state.range(1) == 1;
  const int64_t soft_tokens = state.range(2);
  const fs::path dir = synthetic_tower(preset, w4a16);
  const qs::ModelConfig config = qs::read_model_config(dir / "config.json");
  const qs::Checkpoint checkpoint = qs::Checkpoint::open(dir);
  auto tower = qs::Gemma4VisionTower::load(checkpoint, config, qs::Precision::BF16);
  std::vector<float> pixels;
  std::vector<int32_t> positions;
  const qs::ImagePatches image = test_image(tower->config(), soft_tokens, pixels, positions);
  const int64_t patches = int64_t(positions.size() / 2);
  const double peak_per_thread = peak_fma_flops_per_thread();
  const std::clock_t cpu_start = std::clock();  // the process's CPU time, every thread's
  for (auto _ : state) {
    std::vector<float> out = tower->encode(image);
    benchmark::DoNotOptimize(out.data());
  }
  const double n = double(state.iterations());
  const double flops = image_flops(tower->config(), config.text.hidden_size, patches);
  state.SetLabel(preset + (w4a16 ? " w4a16" : " bf16") + ", " + std::to_string(patches) + " patches");
  state.counters["soft_tokens"] = double(soft_tokens);
  state.counters["soft_tokens_per_s"] = benchmark::Counter(double(soft_tokens) * n, benchmark::Counter::kIsRate);
  state.counters["patches_per_s"] = benchmark::Counter(double(patches) * n, benchmark::Counter::kIsRate);
  state.counters["GFLOP"] = flops / 1e9;
  state.counters["GFLOP_per_s"] = benchmark::Counter(flops * n / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_GFLOP_per_s"] = peak_per_thread * qs::ThreadPool::shared().size() / 1e9;
  // On a shared machine wall time follows the load; CPU seconds of all threads per encode do not (much).
  const double cpu_s = double(std::clock() - cpu_start) / CLOCKS_PER_SEC / n;
  state.counters["cpu_s_all_threads"] = cpu_s;
  // The fraction of peak the encode reaches on the CPU time it got: FLOPs / (CPU s x one thread's peak).
  state.counters["peak_fraction_cpu"] = flops / (cpu_s * peak_per_thread);
  state.counters["weights_MB"] = double(tower->weight_bytes()) / 1e6;
}
// Args: {preset (0 e2b, 1 26b-a4b), w4a16 (1) or bf16 (0), soft tokens}: the default budget of 280 for both towers
// and formats, one image of the 560 budget (twice the patches, four times the attention) on E2B w4a16. The
// processor's 1120 budget (about 7x the 280 one's FLOPs) is left out: minutes an image on the shared 2-core VM.
BENCHMARK(BM_VisionTowerEncode)
    ->ArgsProduct({{0, 1}, {1, 0}, {280}})
    ->Args({0, 1, 560})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace
