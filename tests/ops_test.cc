// Element-wise ops over whole rows against their scalar definitions: bf16 rounding bit for bit (specials included),
// the vector tanh and gelu within a few f32 ulps of std::tanh.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "formats/dtype.h"

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
