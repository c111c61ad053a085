#include "formats/dtype.h"

#include <gtest/gtest.h>

namespace qs {

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_name(DType::BOOL), "BOOL");
  EXPECT_FALSE(parse_dtype("bf16").has_value());
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

}  // namespace qs
