// The audio tower and embed_audio against transformers (the external reference): a tiny random Gemma 4 audio tower
// of the real E2B structure saved by transformers (bf16/) and packed by compressed-tensors (w4a16/), with
// get_audio_features' soft tokens of three clips: long (5 attention chunks), padded at the end, shorter than a
// chunk (tools/python/make_audio_tower_fixture.py, tests/fixtures/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "engine/memory_plan.h"
#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "model/gemma4_audio.h"
#include "model/gemma4_tower_tensors.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

const std::string kFixture = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/audio_tower/";
const char* const kClips[] = {"long", "padded", "short"};

struct Clip {
  std::vector<float> features, want_f32, want_bf16;
  std::vector<uint8_t> mask;
};

Clip load_clip(const std::string& name) {
  SafetensorsFile f = SafetensorsFile::open(kFixture + "reference.safetensors");
  Clip c;
  for (uint16_t b : test::read_tensor<uint16_t>(f, "features_" + name)) c.features.push_back(bf16_to_f32(b));
  c.mask = test::read_tensor<uint8_t>(f, "mask_" + name);
  c.want_f32 = test::read_tensor<float>(f, "out_f32_" + name);
  c.want_bf16 = test::read_tensor<float>(f, "out_bf16_" + name);
  return c;
}

// The encoder with the checkpoint it reads in place.
struct Loaded {
  Checkpoint checkpoint;
  std::unique_ptr<Gemma4AudioEncoder> encoder;
  Gemma4AudioEncoder* operator->() const { return encoder.get(); }
};

Loaded load_encoder(const std::string& format, Precision precision) {
  Loaded l{Checkpoint::open(kFixture + format), nullptr};
  l.encoder = Gemma4AudioEncoder::load(l.checkpoint, read_model_config(kFixture + format + "/config.json"), precision);
  return l;
}

// max |got - want| / max |want|
float relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  float diff = 0, peak = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    peak = std::max(peak, std::fabs(want[i]));
  }
  return diff / peak;
}

// The issue's f32 bar: max |ours - transformers float32| / max |transformers| <= 1e-4.
constexpr float kF32Tolerance = 1e-4f;

TEST(Gemma4Audio, F32MatchesTransformers) {
  for (const char* format : {"bf16", "w4a16"}) {
    auto encoder = load_encoder(format, Precision::F32);
    for (const char* name : kClips) {
      Clip c = load_clip(name);
      std::vector<float> got = encoder->encode(c.features, c.mask);
      ASSERT_EQ(got.size(), c.want_f32.size()) << format << " " << name;
      const float e = relative_error(got, c.want_f32);
      EXPECT_LE(e, kF32Tolerance) << format << " " << name;
      std::printf("[ parity   ] audio %s/%s f32: max |ours - transformers| / max |transformers| = %.3g\n", format,
                  name, e);
    }
  }
}

// bf16 mode against transformers' float32 output: no further off than transformers' own bf16 model is (its
// max |bf16 - f32| / max |f32|, 0.6-1.3% on these clips), with a margin of 1.5x for rounding at other points of
// different summation orders.
TEST(Gemma4Audio, Bf16WithinTransformersOwnBf16Error) {
  for (const char* format : {"bf16", "w4a16"}) {
    auto encoder = load_encoder(format, Precision::BF16);
    for (const char* name : kClips) {
      Clip c = load_clip(name);
      std::vector<float> got = encoder->encode(c.features, c.mask);
      ASSERT_EQ(got.size(), c.want_f32.size()) << format << " " << name;
      const float ours = relative_error(got, c.want_f32), theirs = relative_error(c.want_bf16, c.want_f32);
      EXPECT_LE(ours, 1.5f * theirs) << format << " " << name;
      std::printf("[ parity   ] audio %s/%s bf16: ours %.3g, transformers' bf16 %.3g (vs float32), ours vs "
                  "transformers' bf16 %.3g\n", format, name, ours, theirs, relative_error(got, c.want_bf16));
    }
  }
}

TEST(Gemma4Audio, SoftTokenMaskKeepsEveryFourthFrame) {
  const std::vector<uint8_t> frames = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0};
  EXPECT_EQ(Gemma4AudioEncoder::soft_token_mask(frames), (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(Gemma4AudioEncoder::soft_token_mask(std::vector<uint8_t>(18, 1)).size(), 5u);  // ceil(ceil(18/2)/2)
}

TEST(Gemma4Audio, AllPaddingGivesNoSoftTokens) {
  auto encoder = load_encoder("bf16", Precision::BF16);
  EXPECT_TRUE(encoder->encode(std::vector<float>(20 * 128, 1.0f), std::vector<uint8_t>(20, 0)).empty());
}

TEST(Gemma4Audio, Int4WeightsAreReadAsInt4) {
  EXPECT_LT(load_encoder("w4a16", Precision::F32)->weight_bytes(),
            load_encoder("bf16", Precision::F32)->weight_bytes() / 2);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Gemma4Audio, BadInputIsNamed) {
  auto encoder = load_encoder("bf16", Precision::F32);
  expect_error([&] { encoder->encode(std::vector<float>(10 * 100), std::vector<uint8_t>(10, 1)); }, "128 mel bins");
  expect_error([&] { encoder->encode({}, {}); }, "no frames");
  // A text-only checkpoint has no audio_config.
  const std::string text_only = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/qat_head/bf16";
  expect_error([&] {
    Gemma4AudioEncoder::load(Checkpoint::open(text_only), read_model_config(text_only + "/config.json"),
                             Precision::F32);
  }, "audio_config");
}

TEST(Gemma4Audio, MissingTowerTensorIsNamed) {
  // The bf16 fixture's config over a checkpoint of the text-only fixture: the tower's first tensor is missing.
  const std::string text_only = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/qat_head/bf16";
  expect_error([&] {
    Gemma4AudioEncoder::load(Checkpoint::open(text_only), read_model_config(kFixture + "bf16/config.json"),
                             Precision::F32);
  }, "model.audio_tower.subsample_conv_projection.layer0.conv.weight");
}

// The architecture's tensor list is exactly what transformers saved: names, shapes, bf16.
TEST(Gemma4Audio, TensorListMatchesTheCheckpoint) {
  ModelConfig config = read_model_config(kFixture + "bf16/config.json");
  Checkpoint checkpoint = Checkpoint::open(kFixture + "bf16");
  std::map<std::string, std::vector<int64_t>> stored, listed;
  for (const TensorRef& t : checkpoint.tensors()) stored[t.name()] = t.shape();
  for (const ArchTensor& t : gemma4_audio_tensors(parse_audio_config(config, "config.json"), config.text.hidden_size))
    listed[t.name] = t.shape;
  EXPECT_EQ(listed, stored);
}

// The planner's tower weights are the bytes each format's checkpoint holds.
TEST(Gemma4Audio, PlannedWeightsAreTheCheckpointsBytes) {
  for (auto [dir, format] : {std::pair{"bf16", WeightFormat::Bf16}, std::pair{"w4a16", WeightFormat::W4A16}}) {
    ModelConfig config = read_model_config(kFixture + dir + "/config.json");
    uint64_t bytes = 0;
    Checkpoint checkpoint = Checkpoint::open(kFixture + dir);
    for (const TensorRef& t : checkpoint.tensors()) bytes += t.nbytes();
    AudioTowerPlan plan = audio_tower_plan(parse_audio_config(config, "c"), config.text.hidden_size, format, 203);
    EXPECT_EQ(plan.weights, bytes) << dir;
    EXPECT_EQ(plan.soft_tokens, 51);
  }
}

TEST(Gemma4Audio, ConfigFieldsAreValidated) {
  const auto config = [](const std::string& audio) {
    return parse_model_config(R"({"model_type": "gemma4", "text_config": {"model_type": "gemma4_text",
        "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8}, "audio_config": )" + audio + "}",
                              "config.json");
  };
  Gemma4AudioConfig e2b = parse_audio_config(config("{}"), "config.json");  // transformers' defaults: E2B's
  EXPECT_EQ(e2b.hidden_size, 1024);
  EXPECT_EQ(e2b.context_size(), 24);
  EXPECT_EQ(e2b.projection_input(), 1024);
  expect_error([&] { parse_audio_config(config(R"({"hidden_size": 100, "num_attention_heads": 8})"), "c"); },
               "audio_config.num_attention_heads");
  expect_error([&] { parse_audio_config(config(R"({"subsampling_conv_channels": [128]})"), "c"); },
               "audio_config.subsampling_conv_channels");
  expect_error([&] { parse_audio_config(config(R"({"hidden_act": "gelu"})"), "c"); }, "audio_config.hidden_act");
}

}  // namespace
}  // namespace qs
