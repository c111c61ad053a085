// Element-wise ops over whole rows against their scalar definitions: bf16 rounding bit for bit (specials included),
// the vector tanh and gelu within a few f32 ulps of std::tanh; each instruction set.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/dtype.h"
#include "kernels/isa.h"
#include "test_util.h"

namespace qs {
namespace {

TEST(Ops, RowRoundingToBf16EqualsTheScalarOneBitForBit) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffffffffu, 0x7fff8000u};
  for (uint64_t b = 0; b < (1ull << 32); b += 65537) bits.push_back(static_cast<uint32_t>(b));
  std::vector<float> row;
  for (uint32_t b : bits) row.push_back(std::bit_cast<float>(b));
  round_to_bf16(std::span(row));
  for (size_t i = 0; i < bits.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(row[i]), std::bit_cast<uint32_t>(round_to_bf16(std::bit_cast<float>(bits[i]))))
        << std::hex << bits[i];
}

TEST(Ops, RowTanhAndGeluFollowTheScalarFormulas) {
  std::vector<float> x;
  for (float v = -12; v <= 12; v += 0.0137f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 60.0f, -60.0f});  // an odd count: the masked tail too
  std::vector<float> t = x, g = x;
  tanh(std::span(t));
  gelu_tanh(std::span(g));
  const float k = 0.7978845608028654f;
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i], want_t = std::tanh(v), want_g = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    EXPECT_NEAR(t[i], want_t, 4 * std::numeric_limits<float>::epsilon() * std::fabs(want_t) + 1e-37f) << v;
    EXPECT_NEAR(g[i], want_g, 1e-6f * std::fabs(v) + 1e-37f) << v;
  }
}

}  // namespace
}  // namespace qs

namespace qs {
namespace {

// Every instruction set this CPU has: gelu/tanh (and so the logit soft-cap, a tanh) within the bounds above, AVX2
// and AVX-512 bit for bit (both SLEEF's u10 tanh); the row operations (dots, scaled adds, bf16 rounding) bit for
// bit on every set, portable included (fixed order, no contraction).
TEST(OpsIsa, EveryInstructionSetFollowsTheFormulasAndTheVectorOnesAgreeBitForBit) {
  std::vector<float> x;
  for (float v = -12; v <= 12; v += 0.0137f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 60.0f, -60.0f, NAN, INFINITY, -INFINITY});
  const float k = 0.7978845608028654f;
  std::vector<float> vector_t, vector_g;
  test::for_each_isa([&] {
    std::vector<float> t = x, g = x;
    tanh(std::span(t));
    gelu_tanh(std::span(g));
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = x[i], want_t = std::tanh(v), want_g = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
      if (std::isnan(want_t)) {
        EXPECT_TRUE(std::isnan(t[i]) && std::isnan(g[i])) << v;
        continue;
      }
      EXPECT_NEAR(t[i], want_t, 4 * std::numeric_limits<float>::epsilon() * std::fabs(want_t) + 1e-37f) << v;
      if (std::isnan(want_g)) EXPECT_TRUE(std::isnan(g[i])) << v;  // gelu(-inf) = -inf x 0
      else if (std::isinf(want_g)) EXPECT_EQ(g[i], want_g) << v;
      else EXPECT_NEAR(g[i], want_g, 1e-6f * std::fabs(v) + 1e-37f) << v;
    }
    if (kernel_isa() == Isa::Portable) return;
    if (vector_t.empty()) vector_t = t, vector_g = g;
    EXPECT_EQ(0, std::memcmp(t.data(), vector_t.data(), t.size() * sizeof(float))) << "tanh differs from AVX-512's";
    EXPECT_EQ(0, std::memcmp(g.data(), vector_g.data(), g.size() * sizeof(float))) << "gelu differs from AVX-512's";
  });
}

TEST(OpsIsa, RowOperationsGiveTheSameBitsOnEveryInstructionSet) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  for (int64_t n : {1, 7, 16, 37, 256, 513}) {
    std::vector<float> a(n), b(n), y0(n);
    for (int64_t i = 0; i < n; ++i) a[i] = normal(rng), b[i] = normal(rng), y0[i] = normal(rng);
    std::vector<uint32_t> first;
    test::for_each_isa([&] {
      std::vector<float> y = y0, r = a;
      add_scaled(0.37f, b.data(), y.data(), n);
      round_to_bf16(std::span(r));
      std::vector<uint32_t> bits = {std::bit_cast<uint32_t>(dot(a.data(), b.data(), n))};
      for (const auto* row : {&y, &r})
        for (float v : *row) bits.push_back(std::bit_cast<uint32_t>(v));
      if (first.empty()) first = bits;
      EXPECT_EQ(bits, first) << "n " << n;
    });
  }
}

}  // namespace
}  // namespace qs
