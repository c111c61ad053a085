// The 12B's (gemma4_unified) encoder-free image and audio embedders against Hugging Face transformers (the external
// reference): the tiny random Gemma4UnifiedForConditionalGeneration of tests/fixtures/mm_unified_like (made by
// tools/python/make_unified_mm_fixtures.py), fed the processor's own pixel values and waveform frames. Checked: the
// soft tokens (get_image_features' / get_audio_features' outputs), f32 and bf16, both formats. The whole prompts
// (logits, greedy tokens, from the media's bytes) are checked by ctest unified_multimodal_cli.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "formats/checkpoint.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/gemma4_unified_embedders.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

const std::string kFixture = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/mm_unified_like/";
const std::map<std::string, std::vector<std::string>> kCaseImages = {
    {"image_odd", {"odd_45x71"}}, {"two_images", {"wide_97x33", "square_50x50"}}, {"audio_image", {"square_50x50"}}};
constexpr float kF32RelativeTolerance = 1e-5f;  // max |ours - reference| / max |reference|
// bf16: ours sums in another order than torch; held to 1.5x transformers' own bf16 error against its f32 result.
constexpr float kBf16ErrorRatio = 1.5f;

std::vector<float> bf16_tensor(const SafetensorsFile& f, const std::string& name) {
  std::vector<float> out;
  for (uint16_t b : test::read_tensor<uint16_t>(f, name)) out.push_back(bf16_to_f32(b));
  return out;
}

using test::max_abs;
using test::max_abs_diff;

// A case's soft tokens, image by image: the processor's rows (uint8 levels x float32(1/255), as its torch rescale
// computes them) without its padding rows (position -1).
std::vector<float> encode_images(const Gemma4UnifiedVisionEmbedder& e, const SafetensorsFile& f,
                                 const std::vector<std::string>& images) {
  std::vector<float> all;
  const int64_t P = e.config().patch_values();
  for (const std::string& name : images) {
    std::vector<uint8_t> levels = test::read_tensor<uint8_t>(f, "image." + name + ".pixel_values");
    std::vector<int32_t> positions = test::read_tensor<int32_t>(f, "image." + name + ".position_ids");
    size_t rows = 0;
    while (rows * 2 < positions.size() && positions[rows * 2] >= 0) ++rows;
    std::vector<float> pixels(rows * P);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(levels[i]) * (1.0f / 255.0f);
    positions.resize(rows * 2);
    std::vector<float> soft = e.encode(pixels, positions);
    all.insert(all.end(), soft.begin(), soft.end());
  }
  return all;
}

void expect_close(const std::string& what, std::span<const float> ours, const SafetensorsFile& f,
                  const std::string& prefix, Precision precision) {
  std::vector<float> f32 = test::read_tensor<float>(f, prefix + "_f32");
  ASSERT_EQ(ours.size(), f32.size()) << what;
  if (precision == Precision::F32) {
    const float rel = max_abs_diff(ours, f32) / max_abs(f32);
    EXPECT_LE(rel, kF32RelativeTolerance) << what;
    std::printf("[ unified  ] %s f32: max|diff|/max|ref| = %.3g\n", what.c_str(), rel);
  } else {
    std::vector<float> bf = bf16_tensor(f, prefix + "_bf16");
    const float ours_err = max_abs_diff(ours, f32), hf_err = max_abs_diff(bf, f32);
    EXPECT_LE(ours_err, kBf16ErrorRatio * hf_err) << what;
    std::printf("[ unified  ] %s bf16: max|ours - hf f32| = %.3g, max|hf bf16 - hf f32| = %.3g\n", what.c_str(),
                ours_err, hf_err);
  }
}

void expect_embedders(const std::string& format, Precision precision) {
  SafetensorsFile f = SafetensorsFile::open(kFixture + "reference.safetensors");
  Checkpoint checkpoint = Checkpoint::open(kFixture + format);
  const ModelConfig config = read_model_config(kFixture + format + "/config.json");
  auto vision = Gemma4UnifiedVisionEmbedder::load(checkpoint, config, precision);
  for (const auto& [c, images] : kCaseImages)
    expect_close(format + " " + c + " image", encode_images(*vision, f, images), f, c + ".image_features", precision);
  auto audio = Gemma4UnifiedAudioEmbedder::load(checkpoint, config, precision);
  for (const std::string c : {"audio", "audio_image"})
    expect_close(format + " " + c + " audio", audio->encode(test::read_tensor<float>(f, c + ".input_features")), f,
                 c + ".audio_features", precision);
}

TEST(UnifiedEmbedders, F32MatchTransformers) { expect_embedders("bf16", Precision::F32); }
TEST(UnifiedEmbedders, F32FromW4a16MatchTransformers) { expect_embedders("w4a16", Precision::F32); }
TEST(UnifiedEmbedders, Bf16WithinTransformersOwnError) { expect_embedders("bf16", Precision::BF16); }

TEST(UnifiedEmbedders, PositionOutsideTheTableIsNamed) {
  Checkpoint checkpoint = Checkpoint::open(kFixture + "bf16");
  auto vision = Gemma4UnifiedVisionEmbedder::load(checkpoint, read_model_config(kFixture + "bf16/config.json"),
                                                  Precision::F32);
  std::vector<float> pixels(vision->config().patch_values(), 0.5f);
  std::vector<int32_t> positions = {0, static_cast<int32_t>(vision->config().mm_posemb_size)};
  try {
    vision->encode(pixels, positions);
    FAIL() << "a position past the table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mm_posemb_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qs
