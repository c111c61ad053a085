#include "quant/qat_grid.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "formats/dtype.h"

namespace qs {
namespace {

// A QAT group as the bf16 export stores it: bf16(level x step).
std::vector<float> qat_group(const std::vector<int>& levels, float step) {
  std::vector<float> v;
  for (int l : levels) v.push_back(round_to_bf16(l * step));
  return v;
}

std::vector<int> random_levels(std::mt19937& rng, int lo, int hi) {
  std::vector<int> l(kQatGroupSize);
  for (auto& x : l) x = lo + static_cast<int>(rng() % (hi - lo + 1));
  l[3] = hi;  // the peak is present
  return l;
}

}  // namespace

TEST(QatGrid, RecoversStepWhenPeakIsBelowEight) {
  std::mt19937 rng(1);
  auto levels = random_levels(rng, -5, 5);
  float step = round_to_bf16(0.00731f);
  auto values = qat_group(levels, step);
  int8_t got[kQatGroupSize];
  GroupFit fit = fit_qat_group(values, got);
  ASSERT_TRUE(fit.on_grid);
  EXPECT_EQ(bf16_to_f32(fit.scale_bf16), step);
  for (int i = 0; i < kQatGroupSize; ++i) EXPECT_EQ(got[i], levels[i]);
}

TEST(QatGrid, NegativePeakAtMinusEight) {
  std::mt19937 rng(2);
  auto levels = random_levels(rng, -7, 7);
  levels[10] = -8;
  float step = round_to_bf16(0.0123f);
  auto values = qat_group(levels, step);
  int8_t got[kQatGroupSize];
  GroupFit fit = fit_qat_group(values, got);
  ASSERT_TRUE(fit.on_grid);
  EXPECT_EQ(bf16_to_f32(fit.scale_bf16), step);
  EXPECT_EQ(got[10], -8);
}

// The textbook Q4_0 rule (amax/8) and compressed-tensors' minmax observer (amax/7.5) re-grid QAT weights:
// on groups whose peak is not at level 8 they change values. Only the step search is lossless.
TEST(QatGrid, TextbookRulesAreWrongForQatData) {
  std::mt19937 rng(3);
  int groups = 200, lossless_search = 0, lossless_8 = 0, lossless_75 = 0;
  for (int g = 0; g < groups; ++g) {
    int peak = 3 + static_cast<int>(rng() % 5);  // 3..7: common in QAT groups
    auto levels = random_levels(rng, -peak, peak);
    auto values = qat_group(levels, round_to_bf16(0.001f * (1 + g % 13)));
    int8_t lv[kQatGroupSize];
    lossless_search += fit_qat_group(values, lv).on_grid;
    lossless_8 += fit_fixed_divisor(values, 8.0f, lv).on_grid;
    lossless_75 += fit_fixed_divisor(values, 7.5f, lv).on_grid;
  }
  EXPECT_EQ(lossless_search, groups);
  EXPECT_LT(lossless_8, groups / 10);
  EXPECT_LT(lossless_75, groups / 10);
}

TEST(QatGrid, AllZeroGroupHasZeroScale) {
  std::vector<float> zeros(kQatGroupSize, 0.0f);
  int8_t lv[kQatGroupSize];
  GroupFit fit = fit_qat_group(zeros, lv);
  EXPECT_TRUE(fit.on_grid);
  EXPECT_EQ(fit.scale_bf16, 0);
  for (int8_t l : lv) EXPECT_EQ(l, 0);
  EXPECT_TRUE(group_matches(zeros, {lv, kQatGroupSize}, 0.0f));
}

TEST(QatGrid, OffGridGroupIsRejected) {
  std::mt19937 rng(4);
  auto levels = random_levels(rng, -7, 7);
  float step = round_to_bf16(0.01f);
  auto values = qat_group(levels, step);
  values[5] = round_to_bf16(2.7183f * step);
  values[6] = 7 * step;
  int8_t lv[kQatGroupSize];
  EXPECT_FALSE(fit_qat_group(values, lv).on_grid);
}

TEST(QatGrid, GroupMatchesDetectsAWrongLevel) {
  std::mt19937 rng(5);
  auto levels = random_levels(rng, -8, 7);
  float step = round_to_bf16(0.02f);
  auto values = qat_group(levels, step);
  std::vector<int8_t> lv(levels.begin(), levels.end());
  EXPECT_TRUE(group_matches(values, lv, step));
  lv[0] = static_cast<int8_t>(lv[0] == 7 ? 6 : lv[0] + 1);
  EXPECT_FALSE(group_matches(values, lv, step));
}

TEST(QatGrid, LevelRoundsHalfToEvenAndClamps) {
  EXPECT_EQ(level_on_grid(2.5f, 1.0f), 2);
  EXPECT_EQ(level_on_grid(3.5f, 1.0f), 4);
  EXPECT_EQ(level_on_grid(9.0f, 1.0f), 7);
  EXPECT_EQ(level_on_grid(-9.0f, 1.0f), -8);
  EXPECT_EQ(level_on_grid(1.0f, 0.0f), 0);
}

}  // namespace qs
