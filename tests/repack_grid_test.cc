// `repack --grid`: the lossless step search against the two lossy fixed rules on a synthetic QAT checkpoint.
// Lossless gives the bf16 model's logits exactly; textbook (amax/8) and ct-7.5 (amax/7.5) store other int4 codes,
// change the logits, and `verify` reports them as lossy unless allowed. (That ct-7.5 holds compressed-tensors' own
// codes and scales: tools/python/check_ct_grid_external.py in ctest external_reference.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "checkpoint_tools/verify.h"
#include "engine/eval.h"
#include "formats/checkpoint.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;

class RepackGrids : public ::testing::Test {
 protected:
  void SetUp() override {
    test::synth_quietly({.preset = "e2b-tiny", .out = tmp / "src"});
  }

  fs::path repack(RepackGrid grid) {
    RepackOptions o;
    o.src = tmp / "src";
    o.dst = tmp / std::string(repack_grid_name(grid));
    o.progress = false;
    o.grid = grid;
    repack_checkpoint(o);
    return o.dst;
  }

  VerifyResult verify(const fs::path& dst, bool allow_lossy) {
    VerifyOptions o;
    o.src = tmp / "src";
    o.dst = dst;
    o.progress = false;
    o.allow_lossy = allow_lossy;
    return verify_repack(o);
  }

  // The repack's f32 logits against the bf16 source's over a short token text, with eval's comparison.
  ComparisonTotals compare_with_source(const fs::path& dst) {
    auto model = Gemma4Model::load(dst, Precision::F32);
    auto source = Gemma4Model::load(tmp / "src", Precision::F32);
    std::vector<int32_t> text;
    for (int32_t i = 0; i < 20; ++i) text.push_back(3 + (i * 37) % 200);
    EvalOptions o;
    o.context = 12;
    o.bos_token_id = static_cast<int32_t>(model->config().text.bos_token_id);
    return *run_eval(text, *model, source.get(), o, [](const std::string&) {}).comparison;
  }

  std::string packed_bytes(const fs::path& dst, const std::string& tensor) {
    Checkpoint c = Checkpoint::open(dst);
    const TensorRef& t = c.get(tensor);
    return std::string(reinterpret_cast<const char*>(t.bytes().data()), t.nbytes());
  }

  static nlohmann::json report(const fs::path& dst) {
    std::ifstream in(dst / "repack_report.json");
    return nlohmann::json::parse(in);
  }
  static std::string report_grid(const fs::path& dst) { return report(dst).at("grid").get<std::string>(); }

  test::TempDir tmp;
};

constexpr const char* kPacked = "model.language_model.layers.0.self_attn.q_proj.weight_packed";

TEST_F(RepackGrids, LosslessReproducesTheSourceLogitsExactly) {
  fs::path dst = repack(RepackGrid::Lossless);
  EXPECT_EQ(report_grid(dst), "lossless");
  VerifyResult v = verify(dst, false);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.lossy_groups, 0u);
  // The report's "lossless" is measured as the groups are packed: every one gives back its values.
  const nlohmann::json r = report(dst);
  EXPECT_TRUE(r.at("lossless").get<bool>());
  EXPECT_EQ(r.at("groups_reproduced").get<uint64_t>(), r.at("groups_quantized").get<uint64_t>());
  EXPECT_EQ(r.at("groups_reproduced").get<uint64_t>(), v.groups_checked);
  ComparisonTotals c = compare_with_source(dst);
  EXPECT_EQ(c.max_abs_logit_diff, 0.0);
  EXPECT_EQ(c.kl_sum, 0.0);
  EXPECT_EQ(c.top1_agree, c.positions);
}

TEST_F(RepackGrids, TextbookAndCompressedTensorsRulesAreLossyAndVerifySaysSo) {
  fs::path lossless = repack(RepackGrid::Lossless);
  for (RepackGrid grid : {RepackGrid::Textbook, RepackGrid::Ct75}) {
    SCOPED_TRACE(std::string(repack_grid_name(grid)));
    fs::path dst = repack(grid);
    EXPECT_EQ(report_grid(dst), repack_grid_name(grid));
    EXPECT_NE(packed_bytes(dst, kPacked), packed_bytes(lossless, kPacked));

    VerifyResult strict = verify(dst, false);
    EXPECT_FALSE(strict.ok());
    EXPECT_EQ(strict.failures, 0u) << "every group should still be a nearest-level quantization on its scale";
    EXPECT_GT(strict.lossy_groups, strict.groups_checked / 2);
    EXPECT_GT(strict.lossy_max_error, 0.0f);
    EXPECT_FALSE(strict.first_lossy.empty());
    VerifyResult allowed = verify(dst, true);
    EXPECT_TRUE(allowed.ok());
    EXPECT_EQ(allowed.lossy_groups, strict.lossy_groups);
    // The report measures the same groups as verify reads back from disk.
    const nlohmann::json r = report(dst);
    EXPECT_FALSE(r.at("lossless").get<bool>());
    EXPECT_EQ(r.at("groups_reproduced").get<uint64_t>(), strict.groups_checked - strict.lossy_groups);

    ComparisonTotals c = compare_with_source(dst);
    EXPECT_GT(c.max_abs_logit_diff, 0.0);
    EXPECT_GT(c.mean_kl(), 0.0);
  }
}

TEST(RepackGridRules, CompressedTensorsRoundsTheBf16QuotientAndStoresEpsForZeroGroups) {
  std::vector<float> zeros(32, 0.0f);
  std::vector<int8_t> levels(32, 5);
  GroupFit z = fit_group_on(RepackGrid::Ct75, zeros, levels);
  EXPECT_EQ(z.scale_bf16, 0x3c00);  // bf16 2^-7, compressed-tensors' eps for a zero scale
  EXPECT_EQ(std::count(levels.begin(), levels.end(), 0), 32);
  // amax 1 -> step bf16(1/7.5) = 0.1337890625. 0.2001953125 / step = 1.49635 in f32 (rint: 1) but 1.5 in bf16,
  // which rounds half to even: 2; 0.87109375 / step = 6.51095 in f32 (rint: 7) but 6.5 in bf16: 6. (torch's
  // numbers: compressed-tensors divides the bf16 tensors in bf16.)
  std::vector<float> values(32, 0.0f);
  values[0] = 1.0f, values[1] = 0.2001953125f, values[2] = 0.87109375f, values[3] = -1.0f;
  GroupFit f = fit_group_on(RepackGrid::Ct75, values, levels);
  EXPECT_EQ(f.scale_bf16, 0x3e09);
  EXPECT_EQ(levels[0], 7);  // 1 / step = 7.47 -> 7
  EXPECT_EQ(levels[1], 2);
  EXPECT_EQ(levels[2], 6);
  EXPECT_EQ(levels[3], -7);
  EXPECT_FALSE(f.on_grid);
  EXPECT_EQ(parse_repack_grid("ct-7.5"), RepackGrid::Ct75);
  EXPECT_THROW(parse_repack_grid("amax/8"), Error);
}

}  // namespace
}  // namespace qs
