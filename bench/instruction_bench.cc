// What the int4 kernels' instructions cost on this CPU, in cycles of its own clock: the throughput of each vector
// instruction the decode loops use (eight independent copies a round, so latency does not count), and one group of
// each hot loop's instructions without its loads (linear_avx512.cc's Columns tile: 4 rows x 32 columns;
// linear_avx2.cc's row: 32 columns). The CPU model changes between sessions and port maps differ (Zen 4 runs 512-bit
// instructions on 256-bit pipes): these are the numbers a kernel's design is checked against (BENCHMARKS.md). A
// cycle is one step of a chain of dependent integer adds, measured in the same run. Instructions the CPU lacks are
// skipped.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

namespace {

// Seconds a cycle: a chain of dependent adds runs one a cycle on every x86-64.
double seconds_per_cycle() {
  static const double seconds = [] {
    constexpr long kRounds = 100'000'000;
    long x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kRounds; ++i) asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (4.0 * kRounds);
  }();
  return seconds;
}

// __builtin_cpu_supports takes only literal names. AVX-512 instructions also need avx512f, AVX2's FMAs fma.
bool has(const std::string& extension) {
  if (extension == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!__builtin_cpu_supports("avx512f")) return false;
  if (extension == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (extension == "avx512vbmi") return __builtin_cpu_supports("avx512vbmi");
  if (extension == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
  if (extension == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
  return false;
}

// Runs `round` (one asm statement of `per_round` instructions) and reports cycles per instruction; skipped where
// the CPU lacks `extension` (as has() names it).
template <typename Round>
void cycles_per_instruction(benchmark::State& state, const std::string& extension, int per_round, Round round) {
  if (!has(extension)) return state.SkipWithError(("this CPU lacks " + extension).c_str());
  const double cycle = seconds_per_cycle();
  constexpr long kRounds = 1 << 20;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kRounds; ++i) round();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["cycles"] = seconds / (double(state.iterations()) * kRounds * per_round) / cycle;
  state.counters["GHz"] = 1e-9 / cycle;
}

// Eight copies of one instruction, each writing its own register (zmm0-7 or ymm0-7) from two that never change;
// accumulating instructions, which also read their destination, form eight chains: enough to hide a latency of up
// to eight cycles at one a cycle.
#define COPY(OP, A, B, DEST) OP " " A ", " B ", %%" DEST "\n\t"
#define EIGHT(OP, A, B, R) \
  COPY(OP, A, B, R "0") COPY(OP, A, B, R "1") COPY(OP, A, B, R "2") COPY(OP, A, B, R "3") \
  COPY(OP, A, B, R "4") COPY(OP, A, B, R "5") COPY(OP, A, B, R "6") COPY(OP, A, B, R "7")
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
                 "xmm12", "xmm13", "xmm14", "xmm15"

// EXTENSION: the CPU feature (as __builtin_cpu_supports names it) the instruction needs.
#define ONE_INSTRUCTION(NAME, EXTENSION, TEXT)                                              \
  void BM_##NAME(benchmark::State& state) {                                                 \
    cycles_per_instruction(state, EXTENSION, 8, [] { asm volatile(TEXT ::: CLOBBERS); }); \
  }                                                                                         \
  BENCHMARK(BM_##NAME);

ONE_INSTRUCTION(Zmm_vpermw, "avx512bw", EIGHT("vpermw", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vpermb, "avx512vbmi", EIGHT("vpermb", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vpshufb, "avx512bw", EIGHT("vpshufb", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vpsrlw_imm, "avx512bw", EIGHT("vpsrlw", "$4", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vpandd, "avx512bw", EIGHT("vpandd", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vdpbf16ps, "avx512bf16", EIGHT("vdpbf16ps", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vpdpbusd, "avx512vnni", EIGHT("vpdpbusd", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Zmm_vfmadd231ps, "avx512bw", EIGHT("vfmadd231ps", "%%zmm14", "%%zmm15", "zmm"))
ONE_INSTRUCTION(Ymm_vpshufb, "avx2", EIGHT("vpshufb", "%%ymm14", "%%ymm15", "ymm"))
ONE_INSTRUCTION(Ymm_vpunpcklbw, "avx2", EIGHT("vpunpcklbw", "%%ymm14", "%%ymm15", "ymm"))
ONE_INSTRUCTION(Ymm_vpslld_imm, "avx2", EIGHT("vpslld", "$16", "%%ymm15", "ymm"))
ONE_INSTRUCTION(Ymm_vpsrlvq, "avx2", EIGHT("vpsrlvq", "%%ymm14", "%%ymm15", "ymm"))
ONE_INSTRUCTION(Ymm_vpand, "avx2", EIGHT("vpand", "%%ymm14", "%%ymm15", "ymm"))
ONE_INSTRUCTION(Ymm_vfmadd231ps, "avx2", EIGHT("vfmadd231ps", "%%ymm14", "%%ymm15", "ymm"))

// One group of the Columns tile (linear_avx512.cc, bf16 dot products), loads left out: the 64-byte line (zmm8)
// split into four rows' nibble indices by 3 shifts and 3 masks, each row's 16 levels (zmm13) looked up by vpermw,
// each row's dot product with the activations (zmm15) into its own accumulator (zmm4-7, four chains as in the
// kernel). Reported per group: 128 weights, 72 bytes of int4 and scales.
void BM_Group_Columns_Avx512Bf16(benchmark::State& state) {
  cycles_per_instruction(state, "avx512bf16", 1, [] {
    asm volatile(
        "vpsrlw $4, %%zmm8, %%zmm9\n\tvpsrlw $8, %%zmm8, %%zmm10\n\tvpsrlw $12, %%zmm8, %%zmm11\n\t"
        "vpandd %%zmm8, %%zmm12, %%zmm0\n\tvpandd %%zmm9, %%zmm12, %%zmm1\n\tvpandd %%zmm10, %%zmm12, %%zmm2\n\t"
        "vpermw %%zmm13, %%zmm0, %%zmm0\n\tvpermw %%zmm13, %%zmm1, %%zmm1\n\tvpermw %%zmm13, %%zmm2, %%zmm2\n\t"
        "vpermw %%zmm13, %%zmm11, %%zmm3\n\t"
        "vdpbf16ps %%zmm0, %%zmm15, %%zmm4\n\tvdpbf16ps %%zmm1, %%zmm15, %%zmm5\n\t"
        "vdpbf16ps %%zmm2, %%zmm15, %%zmm6\n\tvdpbf16ps %%zmm3, %%zmm15, %%zmm7\n\t" ::
            : CLOBBERS);
  });
}
BENCHMARK(BM_Group_Columns_Avx512Bf16);

// One row's group on AVX2 as it reads the Lanes layout (linear_avx2.cc's int4_lanes_group and mac), loads left out:
// the variable shift and mask to nibble indices, two level lookups, two byte interleaves, the widening shifts and masks, four
// FMAs into two accumulators (ymm4, ymm5), zeroed each round by a zero idiom (no pipe): the kernel's four rows a pass
// give it eight independent chains, so FMA latency does not bound it and must not here. Reported per row and group:
// 32 weights, 18 bytes.
void BM_Group_Row_Avx2(benchmark::State& state) {
  cycles_per_instruction(state, "avx2", 1, [] {
    asm volatile(
        "vpxor %%ymm4, %%ymm4, %%ymm4\n\tvpxor %%ymm5, %%ymm5, %%ymm5\n\t"
        "vpsrlvq %%ymm13, %%ymm8, %%ymm0\n\tvpand %%ymm12, %%ymm0, %%ymm0\n\t"
        "vpshufb %%ymm0, %%ymm10, %%ymm1\n\tvpshufb %%ymm0, %%ymm11, %%ymm2\n\t"
        "vpunpcklbw %%ymm2, %%ymm1, %%ymm3\n\tvpunpckhbw %%ymm2, %%ymm1, %%ymm1\n\t"
        "vpslld $16, %%ymm3, %%ymm2\n\tvpand %%ymm9, %%ymm3, %%ymm3\n\t"
        "vpslld $16, %%ymm1, %%ymm6\n\tvpand %%ymm9, %%ymm1, %%ymm1\n\t"
        "vfmadd231ps %%ymm6, %%ymm15, %%ymm4\n\tvfmadd231ps %%ymm1, %%ymm15, %%ymm5\n\t"
        "vfmadd231ps %%ymm2, %%ymm15, %%ymm4\n\tvfmadd231ps %%ymm3, %%ymm15, %%ymm5\n\t" ::
            : CLOBBERS);
  });
}
BENCHMARK(BM_Group_Row_Avx2);

}  // namespace
