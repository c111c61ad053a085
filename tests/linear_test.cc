// The linear kernels against a plain double-precision reference on random weights and activations, odd sizes
// included, both activation modes and both weight formats; and the properties the model relies on: int4 and
// bf16 forms of one weight give identical bits, and a token's result does not depend on its batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "kernels/linear_int8.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/huge_buffer.h"
#include "util/parallel.h"
#include "test_util.h"

namespace qs {
namespace {

struct RandomWeight {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, dense;  // dense = bf16(level x scale), as the bf16 QAT export stores it
  HugeBuffer tile_storage, column_storage, block_storage, lane_storage;
  // int4_tiles, int4_columns, int4_blocks, int4_lanes: the kernels' streaming layouts (int4 when out % 4 != 0;
  // blocks in tiles when out % 16 != 0)
  LinearWeight int4, bf16, int4_tiles, int4_columns, int4_blocks, int4_lanes;

  RandomWeight(int64_t out, int64_t in, uint32_t seed) : scales(out * in / 32), dense(out * in) {
    std::mt19937 rng(seed);
    std::vector<int8_t> levels(out * in);
    for (auto& l : levels) l = static_cast<int8_t>(int(rng() % 16) - 8);
    for (auto& s : scales) s = f32_to_bf16(std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -int(rng() % 8) - 4));
    for (int64_t i = 0; i < out * in; ++i)
      dense[i] = f32_to_bf16(levels[i] * bf16_to_f32(scales[i / 32]));
    words.resize(out * in / 8);
    pack_int4(levels, words);
    int4 = {out, in, WeightKind::Int4, reinterpret_cast<const std::byte*>(words.data()),
            reinterpret_cast<const std::byte*>(scales.data()), 32};
    bf16 = {out, in, WeightKind::BF16, reinterpret_cast<const std::byte*>(dense.data())};
    int4_tiles = tiled(int4, tile_storage, ThreadPool::shared());
    int4_columns = tiled(int4, column_storage, ThreadPool::shared(), Int4Layout::Columns);
    int4_blocks = tiled(int4, block_storage, ThreadPool::shared(), Int4Layout::Blocks);
    int4_lanes = tiled(int4, lane_storage, ThreadPool::shared(), Int4Layout::Lanes);
  }
};

std::vector<float> random_activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 2);
  std::vector<float> x(n);
  for (auto& v : x) v = round_to_bf16(normal(rng));
  return x;
}

// Activations 2^-120 as large, rounded to bf16: products and partial sums below f32's smallest normal (2^-126),
// some activations bf16 denormals; where the canonical order's denormal rules (read as zero, flushed) decide bits.
std::vector<float> tiny(std::vector<float> x) {
  for (float& v : x) v = round_to_bf16(std::ldexp(v, -120));
  return x;
}

using test::ScopedBf16Multiply;

std::vector<float> run(const LinearWeight& w, const std::vector<float>& x, int64_t T, Activations a) {
  std::vector<float> y(T * w.out);
  linear_forward(w, x.data(), T, y.data(), ThreadPool::shared(), a);
  return y;
}

// dense: the weight as bf16 [out, in]; the tolerance allows f32 rounding of the sum in any order.
void expect_matches_reference(const std::vector<uint16_t>& dense, int64_t out, int64_t in,
                              const std::vector<float>& x, int64_t T, const std::vector<float>& y) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0, magnitude = 0;
      for (int64_t i = 0; i < in; ++i) {
        double p = double(x[t * in + i]) * bf16_to_f32(dense[o * in + i]);
        sum += p, magnitude += std::abs(p);
      }
      ASSERT_NEAR(y[t * out + o], sum, 1e-6 * magnitude + 1e-30) << "in " << in << " token " << t << " row " << o;
    }
}

struct Shape {
  int64_t out, in, T;
};

class LinearShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearShapes, EveryPathMatchesThePlainReference) {
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, static_cast<uint32_t>(out * 7919 + in * 31 + T));
  const auto x = random_activations(T * in, static_cast<uint32_t>(in + T));
  test::for_each_isa([&] {
    for (Activations a : {Activations::F32, Activations::BF16})
      for (const LinearWeight* lw : {&w.int4, &w.int4_tiles, &w.int4_columns, &w.int4_blocks, &w.int4_lanes, &w.bf16})
        expect_matches_reference(w.dense, out, in, x, T, run(*lw, x, T, a));
  });
}

// AVX2 keeps AVX-512's sixteen lanes in two registers and its reduction tree: the same bits, down to the
// denormal range (with bf16 activations, AVX-512 uses vdpbf16ps where the CPU has it).
TEST_P(LinearShapes, Avx2AndAvx512GiveIdenticalBits) {
  if (!cpu_has(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 here";
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, 41);
  const auto normal = random_activations(T * in, 42);
  for (const auto& x : {normal, tiny(normal)})
    for (Activations a : {Activations::F32, Activations::BF16})
      for (const LinearWeight* lw : {&w.int4, &w.int4_tiles, &w.int4_columns, &w.int4_blocks, &w.int4_lanes, &w.bf16}) {
        const test::ScopedIsa avx2_kernels(Isa::Avx2);
        const auto avx2 = run(*lw, x, T, a);
        set_kernel_isa(Isa::Avx512);
        EXPECT_EQ(avx2, run(*lw, x, T, a));
      }
}

// vdpbf16ps (where the CPU has it and it passed linear_avx512.cc's check, whether or not it is the faster here) and
// AVX-512's f32 FMA path: the same bits for every weight form, ordinary and denormal-range activations.
TEST_P(LinearShapes, Bf16DotProductsAndFmaGiveIdenticalBits) {
  if (!cpu_has(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 here";
  const ScopedBf16Multiply dot_products(Bf16Multiply::DotProducts);
  if (!bf16_dot_products_used()) GTEST_SKIP() << "no exact bf16 dot products here";
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, 51);
  const auto normal = random_activations(T * in, 52);
  const test::ScopedIsa avx512_kernels(Isa::Avx512);
  for (const auto& x : {normal, tiny(normal)})
    for (const LinearWeight* lw : {&w.int4, &w.int4_tiles, &w.int4_columns, &w.int4_blocks, &w.int4_lanes, &w.bf16}) {
      set_bf16_multiply(Bf16Multiply::DotProducts);
      const auto dot = run(*lw, x, T, Activations::BF16);
      set_bf16_multiply(Bf16Multiply::Fma);
      EXPECT_EQ(dot, run(*lw, x, T, Activations::BF16));
    }
}

TEST_P(LinearShapes, Int4AndBf16FormsGiveIdenticalBits) {
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, 11);
  const auto x = random_activations(T * in, 12);
  for (Activations a : {Activations::F32, Activations::BF16}) {
    EXPECT_EQ(run(w.int4, x, T, a), run(w.bf16, x, T, a));
    EXPECT_EQ(run(w.int4_tiles, x, T, a), run(w.bf16, x, T, a));
    EXPECT_EQ(run(w.int4_columns, x, T, a), run(w.bf16, x, T, a));
    EXPECT_EQ(run(w.int4_blocks, x, T, a), run(w.bf16, x, T, a));
    EXPECT_EQ(run(w.int4_lanes, x, T, a), run(w.bf16, x, T, a));
  }
}

TEST_P(LinearShapes, TiledInt4HoldsTheSameRows) {
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, 31);
  EXPECT_EQ(w.int4_tiles.layout, out % kTileRows ? Int4Layout::Rows : Int4Layout::Tiles);
  EXPECT_EQ(w.int4_columns.layout, out % kTileRows ? Int4Layout::Rows : Int4Layout::Columns);
  EXPECT_EQ(w.int4_blocks.layout, out % kTileRows    ? Int4Layout::Rows
                                  : out % kBlockRows ? Int4Layout::Tiles
                                                     : Int4Layout::Blocks);
  EXPECT_EQ(w.int4_lanes.layout, out % kTileRows ? Int4Layout::Rows : Int4Layout::Lanes);
  std::vector<float> a(in), b(in);
  for (int64_t r = 0; r < out; ++r) {
    w.int4.dequantize_row(r, a.data());
    for (const LinearWeight* lw : {&w.int4_tiles, &w.int4_columns, &w.int4_blocks, &w.int4_lanes}) {
      lw->dequantize_row(r, b.data());
      ASSERT_EQ(a, b) << "row " << r;
    }
  }
}

TEST_P(LinearShapes, ATokenGetsTheSameBitsAloneAsInItsBatch) {
  const auto [out, in, T] = GetParam();
  RandomWeight w(out, in, 21);
  const auto x = random_activations(T * in, 22);
  for (Activations a : {Activations::F32, Activations::BF16}) {
    const auto batch = run(w.int4, x, T, a);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> alone_x(x.begin() + t * in, x.begin() + (t + 1) * in);
      const auto alone = run(w.int4, alone_x, 1, a);
      ASSERT_EQ(alone, std::vector<float>(batch.begin() + t * out, batch.begin() + (t + 1) * out)) << "token " << t;
    }
  }
}

// Independent products in one job give each the bits it gets alone, tile boundaries of tiled weights kept whole
// wherever the threads split the rows; inputs may be shared or not, token counts may differ.
TEST(LinearJobs, EachResultEqualsItsOwnCall) {
  RandomWeight a(36, 160, 1), b(6, 160, 2), c(40, 160, 3), d(12, 96, 5), e(48, 160, 7);
  const auto x = random_activations(3 * 160, 4), x2 = random_activations(5 * 96, 6);
  for (Activations act : {Activations::F32, Activations::BF16}) {
    std::vector<float> ya(3 * 36), yb(3 * 6), yc(3 * 40), yd(3 * 36), ye(5 * 12), yf(3 * 48);
    const LinearJob jobs[] = {{&a.int4_tiles, x.data(), 3, ya.data()}, {&b.int4, x.data(), 3, yb.data()},
                              {&c.int4_columns, x.data(), 3, yc.data()}, {&a.bf16, x.data(), 3, yd.data()},
                              {&d.int4_lanes, x2.data(), 5, ye.data()}, {&e.int4_blocks, x.data(), 3, yf.data()}};
    linear_forward(jobs, ThreadPool::shared(), act);
    EXPECT_EQ(ya, run(a.int4, x, 3, act));
    EXPECT_EQ(yb, run(b.int4, x, 3, act));
    EXPECT_EQ(yc, run(c.int4, x, 3, act));
    EXPECT_EQ(yd, ya);
    EXPECT_EQ(ye, run(d.int4, x2, 5, act));
    EXPECT_EQ(yf, run(e.int4, x, 3, act));
  }
}

// Which way this CPU multiplies bf16 activations, as bench's header also says (a line for the log, no claim: both
// give the same bits, the choice is by speed).
TEST(LinearBf16DotProducts, ChoiceIsReported) {
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "no AVX512_BF16 here";
  const bool exact = [] {
    const ScopedBf16Multiply dot_products(Bf16Multiply::DotProducts);
    return bf16_dot_products_used();
  }();
  std::printf("[ kernels  ] vdpbf16ps %s the canonical order's bits here; bf16 activations multiplied by %s\n",
              exact ? "gives" : "does not give", bf16_dot_products_used() ? "vdpbf16ps" : "f32 FMA");
}

// A model gets the Columns layout only where bf16 dot products will read it, Blocks only where the VNNI kernel will,
// Lanes only where AVX2 will; AVX-512's f32 (the parity reference, f32 FMA) keeps Tiles.
TEST(LinearLayouts, ColumnsOnlyForTheBf16DotProductsBlocksOnlyForVnniLanesOnlyForAvx2) {
  const bool avx2 = kernel_isa() == Isa::Avx2;
  EXPECT_EQ(fastest_int4_layout(Activations::F32), avx2 ? Int4Layout::Lanes : Int4Layout::Tiles);
  EXPECT_EQ(fastest_int4_layout(Activations::Int8),
            kernel_isa() == Isa::Avx512 && int8::cpu_has_vnni() ? Int4Layout::Blocks : Int4Layout::Tiles);
  const bool dot_products = kernel_isa() == Isa::Avx512 && bf16_dot_products_used();
  EXPECT_EQ(multiplies_by_bf16_dot_products(Activations::BF16), dot_products);
  EXPECT_EQ(fastest_int4_layout(Activations::BF16),
            dot_products ? Int4Layout::Columns : avx2 ? Int4Layout::Lanes : Int4Layout::Tiles);
  const test::ScopedIsa avx2_kernels(Isa::Avx2);
  EXPECT_EQ(fastest_int4_layout(Activations::F32), Int4Layout::Lanes);
  EXPECT_EQ(fastest_int4_layout(Activations::BF16), Int4Layout::Lanes);
  EXPECT_EQ(fastest_int4_layout(Activations::Int8), Int4Layout::Tiles);
}

// bf16 weights of any width (transformers' test config has a 37-wide MLP).
TEST(LinearBf16Weights, AnyWidthMatchesThePlainReference) {
  for (int64_t in : {1, 5, 31, 37, 63, 65, 100}) {
    const int64_t out = 3, T = 6;
    std::mt19937 rng(static_cast<uint32_t>(in));
    std::vector<uint16_t> dense(out * in);
    for (auto& v : dense) v = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
    const LinearWeight w{out, in, WeightKind::BF16, reinterpret_cast<const std::byte*>(dense.data())};
    const auto x = random_activations(T * in, static_cast<uint32_t>(in) + 1);
    test::for_each_isa([&] {
      for (Activations a : {Activations::F32, Activations::BF16})
        expect_matches_reference(dense, out, in, x, T, run(w, x, T, a));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(OddAndRealSizes, LinearShapes,
                         ::testing::Values(Shape{1, 32, 1}, Shape{3, 96, 2}, Shape{5, 64, 3}, Shape{17, 160, 4},
                                           Shape{6, 224, 5}, Shape{33, 1536, 1}, Shape{9, 288, 9},
                                           Shape{7, 128, 70}, Shape{40, 1536, 131}, Shape{8, 64, 1},
                                           Shape{12, 96, 4}, Shape{20, 256, 7}, Shape{16, 64, 3},
                                           Shape{48, 1536, 1}, Shape{32, 288, 19}, Shape{24, 1536, 6},
                                           Shape{32, 96, 12}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "out" + std::to_string(s.out) + "_in" + std::to_string(s.in) + "_T" + std::to_string(s.T);
                         });

}  // namespace
}  // namespace qs

namespace qs {
namespace {

// W4A8 (Activations::Int8): the VNNI kernel (Blocks) computes the portable definition's bits, every layout gives
// them, and the result stays within the quantisation error's bound of the exact product: each activation moves by
// at most half its group's step d. Token counts cover passes of 8 tokens and each shorter pass.
TEST(LinearInt8, VnniEqualsTheDefinitionAndStaysWithinTheQuantisationBound) {
  for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 15}) {
    const int64_t out = 32, in = 160;
    RandomWeight w(out, in, static_cast<uint32_t>(70 + T));
    ASSERT_EQ(w.int4_blocks.layout, Int4Layout::Blocks);
    const auto x = random_activations(T * in, static_cast<uint32_t>(80 + T));
    std::vector<int8::Group> q(T * in / 32), qv(T * in / 32);
    int8::quantize(x.data(), in, T, q.data());
    std::vector<float> ref(T * out), y(T * out);
    int8::rows_portable(w.int4_tiles, q.data(), T, ref.data(), 0, out);
    if (int8::cpu_has_vnni()) {
      int8::quantize_avx512(x.data(), in, T, qv.data());
      ASSERT_EQ(0, std::memcmp(q.data(), qv.data(), q.size() * sizeof(int8::Group)));
      int8::rows_vnni(w.int4_blocks, q.data(), T, y.data(), 0, out);
      ASSERT_EQ(y, ref) << "T " << T;
    }
    // Through linear_forward: the widest path on Blocks, the portable code on the other layouts.
    for (const LinearWeight* lw : {&w.int4_tiles, &w.int4_columns, &w.int4_blocks, &w.int4_lanes})
      EXPECT_EQ(run(*lw, x, T, Activations::Int8), ref);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double exact = 0, bound = 0;
        for (int64_t i = 0; i < in; ++i) {
          const double wi = bf16_to_f32(w.dense[o * in + i]);
          exact += wi * x[t * in + i];
          bound += std::abs(wi) * q[t * (in / 32) + i / 32].scale * 0.5;
        }
        ASSERT_NEAR(ref[t * out + o], exact, bound * 1.01 + 1e-4) << "token " << t << " row " << o;
      }
  }
}

// Weights the int8 path does not take (bf16, or int4 rows outside tiles) keep bf16 activations.
TEST(LinearInt8, OtherWeightsKeepBf16Activations) {
  RandomWeight w(6, 96, 90);
  const auto x = random_activations(2 * 96, 91);
  EXPECT_EQ(run(w.bf16, x, 2, Activations::Int8), run(w.bf16, x, 2, Activations::BF16));
  EXPECT_EQ(run(w.int4, x, 2, Activations::Int8), run(w.int4, x, 2, Activations::BF16));
}

}  // namespace
}  // namespace qs
