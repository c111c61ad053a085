// Gemma 4's log-mel audio features against transformers' Gemma4AudioFeatureExtractor and Gemma4Processor
// (tests/golden/audio/features.safetensors, made by tools/python/make_audio_golden.py; the live check is ctest
// audio_external).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "formats/safetensors.h"
#include "media/audio_features.h"
#include "test_util.h"
#include "util/error.h"

namespace qs::media {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/golden/audio";

// The extractor computes its FFT in float32 (numpy 2 keeps float32): its own rounding is ~5e-7 on features of
// magnitude up to ~7; ours is float64. Relative to |value|, or to 1 where the log crosses 0.
constexpr double kRelativeTolerance = 1e-5;

const SafetensorsFile& golden() {
  static const SafetensorsFile f = SafetensorsFile::open(kGolden / "features.safetensors");
  return f;
}

std::vector<float> pcm_to_float(const std::vector<int16_t>& pcm) {
  std::vector<float> out;
  for (int16_t v : pcm) out.push_back(static_cast<float>(v) / 32768.0f);
  return out;
}

// Worst |ours - expected| / max(|expected|, 1) over matching rows.
double worst_relative_error(const float* ours, const std::vector<float>& expected) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    worst = std::max(worst, std::abs(double(ours[i]) - expected[i]) / std::max(1.0, std::abs(double(expected[i]))));
  return worst;
}

void expect_matches(const std::string& name, const AudioFeatures& ours) {
  const auto expected = test::read_tensor<float>(golden(), name + ".features");
  const auto mask = test::read_tensor<uint8_t>(golden(), name + ".mask");
  ASSERT_EQ(ours.num_frames, static_cast<int>(mask.size())) << name;
  EXPECT_EQ(ours.mask, mask) << name;
  ASSERT_EQ(ours.features.size(), expected.size()) << name;
  const double worst = worst_relative_error(ours.features.data(), expected);
  EXPECT_LE(worst, kRelativeTolerance) << name;
  std::printf("%-14s %4d frames, %3d soft tokens, worst relative error %.2e\n", name.c_str(), ours.num_frames,
              ours.num_soft_tokens, worst);
}

TEST(AudioFeatures, MatchTransformersOnTestSignals) {
  int cases = 0;
  for (const TensorEntry& t : golden().tensors()) {
    const std::string suffix = ".pcm";
    if (!t.name.ends_with(suffix)) continue;
    const std::string name = t.name.substr(0, t.name.size() - suffix.size());
    const AudioFeatures ours = extract_audio_features(pcm_to_float(test::read_tensor<int16_t>(golden(), t.name)), {});
    expect_matches(name, ours);
    const auto tokens = test::read_tensor<int64_t>(golden(), name + ".soft_tokens");
    EXPECT_EQ(ours.num_soft_tokens, tokens[0]) << name << ": Gemma4Processor.replace_audio_token";
    EXPECT_EQ(ours.num_soft_tokens, tokens[1]) << name << ": Gemma4Processor._compute_audio_num_tokens";
    ++cases;
  }
  EXPECT_GE(cases, 12);
}

TEST(AudioFeatures, LongClipIsCutAt30Seconds) {
  const auto segment = test::read_tensor<int16_t>(golden(), "long.segment");
  const int64_t repeats = test::read_tensor<int64_t>(golden(), "long.repeats").at(0);
  std::vector<int16_t> pcm;
  for (int64_t r = 0; r < repeats; ++r) pcm.insert(pcm.end(), segment.begin(), segment.end());
  const AudioFeatures ours = extract_audio_features(pcm_to_float(pcm), {});
  EXPECT_EQ(ours.mask, test::read_tensor<uint8_t>(golden(), "long.mask"));
  EXPECT_EQ(ours.num_soft_tokens, test::read_tensor<int64_t>(golden(), "long.soft_tokens").at(0));
  EXPECT_EQ(ours.num_soft_tokens, 750);
  const auto rows = test::read_tensor<int64_t>(golden(), "long.rows");
  const auto expected = test::read_tensor<float>(golden(), "long.features");
  ASSERT_EQ(expected.size(), rows.size() * ours.num_mel);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<float> row(expected.begin() + i * ours.num_mel, expected.begin() + (i + 1) * ours.num_mel);
    EXPECT_LE(worst_relative_error(ours.features.data() + rows[i] * ours.num_mel, row), kRelativeTolerance)
        << "row " << rows[i];
  }
}

TEST(AudioFeatures, OptionsFromProcessorConfigMatchTransformers) {
  const auto sweep = pcm_to_float(test::read_tensor<int16_t>(golden(), "sweep.pcm"));
  for (const std::string variant : {"variant_htk", "variant_plain"}) {
    const AudioFeatureOptions options = read_audio_feature_options(kGolden / variant);
    expect_matches(variant, extract_audio_features(sweep, options));
  }
  const AudioFeatureOptions htk = read_audio_feature_options(kGolden / "variant_htk");
  EXPECT_EQ(htk.frame_length(), 400);
  EXPECT_EQ(htk.hop_length(), 200);
  EXPECT_EQ(htk.fft_length(), 1024);
  EXPECT_EQ(htk.feature_size, 80);
}

void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

std::string error_of(const std::filesystem::path& dir) {
  try {
    read_audio_feature_options(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AudioFeatures, OptionsDefaultWithoutConfigAndRefuseBadFields) {
  test::TempDir dir;
  const AudioFeatureOptions defaults = read_audio_feature_options(dir.path());
  EXPECT_EQ(defaults.feature_size, 128);
  EXPECT_EQ(defaults.frame_length(), 320);
  EXPECT_EQ(defaults.hop_length(), 160);
  EXPECT_EQ(defaults.fft_length(), 512);
  const auto config = dir / "processor_config.json";
  const auto with = [&](const std::string& fields) {
    write(config, R"({"feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor", )" + fields + "}}");
    return error_of(dir.path());
  };
  EXPECT_EQ(with(R"("frame_length": 320, "hop_length": 160, "fft_length": 512)"), "");  // as transformers saves it
  EXPECT_NE(with(R"("mel_floor": "0.001")").find("field 'mel_floor' is string, expected a number"), std::string::npos);
  EXPECT_NE(with(R"("dither": 0.0001)").find("field 'dither'"), std::string::npos);
  EXPECT_NE(with(R"("frame_length": 400)").find("field 'frame_length' is 400, but transformers derives 320"),
            std::string::npos);
  EXPECT_NE(with(R"("per_bin_mean": [1, 2])").find("have 2 values, expected feature_size = 128"), std::string::npos);
  EXPECT_NE(with(R"("hop_length_ms": 0)").find("hop_length_ms 0"), std::string::npos);
  EXPECT_NE(with(R"("padding_side": "left")").find("field 'padding_side'"), std::string::npos);
  EXPECT_NE(with(R"("sampling_rate": 24000)").find("field 'sampling_rate' is 24000, but decode_audio delivers 16000"),
            std::string::npos);
  write(config, "{not json");
  EXPECT_NE(error_of(dir.path()).find("processor_config.json: not valid JSON"), std::string::npos);
}

TEST(AudioFeatures, NoFramesBeforeTheFirstFullWindow) {
  const AudioFeatures none = extract_audio_features(std::vector<float>(100, 0.5f), {});
  EXPECT_EQ(none.num_frames, 0);
  EXPECT_EQ(none.num_soft_tokens, 0);
  EXPECT_TRUE(none.features.empty());
  EXPECT_EQ(extract_audio_features(std::vector<float>{}, {}).num_frames, 0);
}

TEST(AudioFeatures, PlaceholderExpansion) {
  EXPECT_EQ(expand_audio_placeholder(2), "<|audio><|audio|><|audio|><audio|>");
  EXPECT_EQ(expand_audio_placeholder(0), "<|audio><audio|>");
}

}  // namespace
}  // namespace qs::media
