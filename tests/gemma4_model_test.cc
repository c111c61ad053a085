// The forward pass on synthetic checkpoints: decoding with the KV cache equals a full re-forward (also past
// the sliding window) and a sequence batched with another equals it alone, bit for bit in f32, bf16 and int8; the
// int4 repack gives exactly the bf16 checkpoint's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

std::filesystem::path synth_bf16(const test::TempDir& tmp, const std::string& preset) {
  return test::synth_quietly({.preset = preset, .out = tmp / preset});
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(10 + (i * 37) % 4000);
  return ids;
}

// `preset` in `precision`: f32 and bf16 on the bf16 QAT checkpoint, int8 on its int4 repack (int8 activations
// apply to int4 linears only).
std::unique_ptr<Gemma4Model> load_in(const test::TempDir& tmp, const std::string& preset, Precision precision) {
  const auto bf16 = synth_bf16(tmp, preset);
  if (precision != Precision::Int8) return Gemma4Model::load(bf16, precision);
  RepackOptions o{bf16, tmp / (preset + "-int4")};
  o.progress = false;
  repack_checkpoint(o);
  auto model = Gemma4Model::load(o.dst, precision);
  if (!model->int4_weights()) throw Error("the int4 repack of " + preset + " loaded without int4 weights");
  return model;
}

std::string label(const std::string& preset, Precision precision) {
  return preset + " " + std::string(precision_name(precision));
}

// Bit equality: a token's logits must not depend on its batch or on how its context reached the cache.
void expect_same_bits(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0) return;
  size_t differ = 0, first = got.size();
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ++differ;
      first = std::min(first, i);
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
  ADD_FAILURE() << what << ": " << differ << " of " << got.size() << " logits differ, first at " << first << " ("
                << got[first] << " vs " << want[first] << "), max |difference| " << worst;
}

void expect_cached_decode_equals_full_forward(const std::string& preset, Precision precision) {
  test::TempDir tmp;
  auto model = load_in(tmp, preset, precision);
  const int64_t V = model->config().text.vocab_size;
  auto ids = prompt(40);  // well past the window of 4, and across two boundaries of the KV cache's 16-position blocks
  KvCache full = model->new_cache(64);
  std::vector<float> all = model->forward(ids, full, /*all_logits=*/true);
  ASSERT_EQ(all.size(), ids.size() * V);
  for (float x : all) ASSERT_TRUE(std::isfinite(x));
  auto row = [&](size_t t) { return std::span<const float>(all).subspan(t * V, V); };

  // Prefill 5 tokens (more than the window) then decode one at a time.
  KvCache cache = model->new_cache(64);
  std::vector<float> last = model->forward(std::span(ids).first(5), cache, false);
  expect_same_bits(last, row(4), label(preset, precision) + " prefill of 5");
  for (size_t t = 5; t < ids.size(); ++t) {
    last = model->forward(std::span(ids).subspan(t, 1), cache, false);
    expect_same_bits(last, row(t), label(preset, precision) + " position " + std::to_string(t));
  }
}

// Continuous batching: a decode step of one sequence beside a prompt chunk of another, in one pass, gives each
// exactly what it gets alone.
void expect_batched_sequences_equal_separate_ones(const std::string& preset, Precision precision) {
  test::TempDir tmp;
  auto model = load_in(tmp, preset, precision);
  auto a = prompt(21), b = prompt(7);  // a decodes its 21st token from two KV blocks of 16
  b[3] = 99;
  KvCache alone_a = model->new_cache(32), alone_b = model->new_cache(32);
  model->forward(std::span(a).first(20), alone_a, false);
  auto want_a = model->forward(std::span(a).subspan(20), alone_a, false);
  auto want_b = model->forward(b, alone_b, false);

  KvCache batch_a = model->new_cache(32), batch_b = model->new_cache(32);
  model->forward(std::span(a).first(20), batch_a, false);
  SequenceStep steps[] = {{std::span(a).subspan(20), &batch_a, LogitsWanted::Last}, {b, &batch_b, LogitsWanted::Last}};
  auto both = model->forward_batch(steps);
  const int64_t V = model->config().text.vocab_size;
  ASSERT_EQ(both.size(), 2u * V);
  expect_same_bits(std::span(both).first(V), want_a, label(preset, precision) + " decoding sequence");
  expect_same_bits(std::span(both).subspan(V), want_b, label(preset, precision) + " prefilling sequence");
  EXPECT_EQ(batch_b.length(), 7);
}

}  // namespace

TEST(Gemma4Model, CachedDecodeEqualsFullForwardE2B) {
  for (Precision p : {Precision::F32, Precision::BF16, Precision::Int8})
    expect_cached_decode_equals_full_forward("e2b-tiny", p);
}
TEST(Gemma4Model, CachedDecodeEqualsFullForwardMoE) {
  for (Precision p : {Precision::F32, Precision::BF16, Precision::Int8})
    expect_cached_decode_equals_full_forward("26b-a4b-tiny", p);
}

TEST(Gemma4Model, Int4RepackGivesTheSameLogits) {
  for (std::string preset : {"e2b-tiny", "26b-a4b-tiny"}) {
    test::TempDir tmp;
    auto src = synth_bf16(tmp, preset);
    RepackOptions o{src, tmp / "int4"};
    o.progress = false;
    repack_checkpoint(o);
    auto bf16 = Gemma4Model::load(src, Precision::F32);
    auto int4 = Gemma4Model::load(tmp / "int4", Precision::F32);
    EXPECT_FALSE(bf16->int4_weights());
    EXPECT_TRUE(int4->int4_weights());
    auto ids = prompt(9);
    KvCache a = bf16->new_cache(32), b = int4->new_cache(32);
    EXPECT_EQ(bf16->forward(ids, a, true), int4->forward(ids, b, true)) << preset;
  }
}

// QAT embeddings lie on the 4-bit grid, so the tied LM head is read as a lossless int4 repack; an embedding off the
// grid keeps the bf16 head. Both give the bf16 table's logits (the kernels' int4 and bf16 forms are bit-identical).
TEST(Gemma4Model, LmHeadIsInt4ExactlyWhenTheEmbeddingIsOnTheGrid) {
  test::TempDir tmp;
  auto on_grid = Gemma4Model::load(synth_bf16(tmp, "e2b-tiny"), Precision::F32);
  EXPECT_EQ(on_grid->lm_head().kind, WeightKind::Int4);
  auto off_grid = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp / "off-grid",
                                                         .fault_off_grid = "model.language_model.embed_tokens.weight"}),
                                   Precision::F32);
  EXPECT_EQ(off_grid->lm_head().kind, WeightKind::BF16);

  // Same model but the one off-grid group: the int4 head's logits equal the bf16 head's except where that group
  // (row 0, columns 0-31) enters, i.e. the logit of token 0.
  auto ids = prompt(6);
  KvCache a = on_grid->new_cache(16), b = off_grid->new_cache(16);
  auto la = on_grid->forward(ids, a, false), lb = off_grid->forward(ids, b, false);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t v = 1; v < la.size(); ++v) ASSERT_EQ(la[v], lb[v]) << "token " << v;
}

TEST(Gemma4Model, BatchedSequencesEqualSeparateOnes) {
  for (std::string preset : {"e2b-tiny", "26b-a4b-tiny"})
    for (Precision p : {Precision::F32, Precision::BF16, Precision::Int8})
      expect_batched_sequences_equal_separate_ones(preset, p);
}

TEST(Gemma4Model, PromptLongerThanContextIsAClearError) {
  test::TempDir tmp;
  auto model = Gemma4Model::load(synth_bf16(tmp, "e2b-tiny"), Precision::F32);
  KvCache cache = model->new_cache(8);
  try {
    model->forward(prompt(9), cache, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 9 positions but the context holds 8"), std::string::npos) << e.what();
  }
}

TEST(Gemma4Model, MissingTensorIsNamed) {
  test::TempDir tmp;
  const auto dir = test::synth_quietly(
      {.preset = "e2b-tiny", .out = tmp / "m", .fault_missing = "model.language_model.layers.3.mlp.up_proj.weight"});
  try {
    Gemma4Model::load(dir, Precision::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
}

TEST(Gemma4Model, UnknownQuantizationSchemeNamesLayerAndScheme) {
  test::TempDir tmp;
  const auto dir = test::synth_quietly({.preset = "e2b-tiny", .format = CheckpointFormat::W4A16, .out = tmp / "q"});
  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  std::ofstream(dir / "config.json") << config.dump();
  try {
    Gemma4Model::load(dir, Precision::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("layer 'model.language_model.per_layer_model_projection'"), std::string::npos) << what;
    EXPECT_NE(what.find("8-bit"), std::string::npos) << what;
  }
}

}  // namespace qs
