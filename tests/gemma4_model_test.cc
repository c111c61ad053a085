// The forward pass on synthetic checkpoints: decoding with the KV cache equals a full re-forward (also past
// the sliding window), and the int4 repack gives exactly the bf16 checkpoint's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

// Options for a synthetic checkpoint of `preset` in tmp / name, quietly.
SynthOptions synth_options(const test::TempDir& tmp, const std::string& preset, const std::string& name) {
  SynthOptions o;
  o.preset = preset;
  o.out = tmp / name;
  o.progress = false;
  return o;
}

std::filesystem::path synth_bf16(const test::TempDir& tmp, const std::string& preset) {
  SynthOptions o = synth_options(tmp, preset, preset);
  synth_checkpoint(o);
  return o.out;
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(10 + (i * 37) % 4000);
  return ids;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

void expect_cached_decode_equals_full_forward(const std::string& preset, Precision precision) {
  test::TempDir tmp;
  auto model = Gemma4Model::load(synth_bf16(tmp, preset), precision);
  const int64_t V = model->config().text.vocab_size;
  auto ids = prompt(13);  // window is 4: well past it
  KvCache full = model->new_cache(64);
  std::vector<float> all = model->forward(ids, full, /*all_logits=*/true);
  ASSERT_EQ(all.size(), ids.size() * V);
  for (float x : all) ASSERT_TRUE(std::isfinite(x));

  // Prefill 5 tokens (more than the window) then decode one at a time.
  KvCache cache = model->new_cache(64);
  std::vector<float> last = model->forward(std::span(ids).first(5), cache, false);
  EXPECT_LE(max_abs_diff(last, std::vector<float>(all.begin() + 4 * V, all.begin() + 5 * V)), 1e-5f);
  for (size_t t = 5; t < ids.size(); ++t) {
    last = model->forward(std::span(ids).subspan(t, 1), cache, false);
    std::vector<float> want(all.begin() + t * V, all.begin() + (t + 1) * V);
    EXPECT_LE(max_abs_diff(last, want), 1e-5f) << preset << " position " << t;
  }
}

}  // namespace

TEST(Gemma4Model, CachedDecodeEqualsFullForwardE2B) { expect_cached_decode_equals_full_forward("e2b-tiny", Precision::F32); }
TEST(Gemma4Model, CachedDecodeEqualsFullForwardMoE) { expect_cached_decode_equals_full_forward("26b-a4b-tiny", Precision::F32); }
TEST(Gemma4Model, CachedDecodeEqualsFullForwardBf16) { expect_cached_decode_equals_full_forward("e2b-tiny", Precision::BF16); }

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
  SynthOptions o = synth_options(tmp, "e2b-tiny", "off-grid");
  o.fault_off_grid = "model.language_model.embed_tokens.weight";
  synth_checkpoint(o);
  auto off_grid = Gemma4Model::load(o.out, Precision::F32);
  EXPECT_EQ(off_grid->lm_head().kind, WeightKind::BF16);

  // Same model but the one off-grid group: the int4 head's logits equal the bf16 head's except where that group
  // (row 0, columns 0-31) enters, i.e. the logit of token 0.
  auto ids = prompt(6);
  KvCache a = on_grid->new_cache(16), b = off_grid->new_cache(16);
  auto la = on_grid->forward(ids, a, false), lb = off_grid->forward(ids, b, false);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t v = 1; v < la.size(); ++v) ASSERT_EQ(la[v], lb[v]) << "token " << v;
}

// Continuous batching: a decode step of one sequence beside a prompt chunk of another, in one pass, gives each
// exactly what it gets alone.
TEST(Gemma4Model, BatchedSequencesEqualSeparateOnes) {
  for (std::string preset : {"e2b-tiny", "26b-a4b-tiny"}) {
    test::TempDir tmp;
    auto model = Gemma4Model::load(synth_bf16(tmp, preset), Precision::F32);
    auto a = prompt(11), b = prompt(7);
    b[3] = 99;
    KvCache alone_a = model->new_cache(32), alone_b = model->new_cache(32);
    model->forward(std::span(a).first(10), alone_a, false);
    auto want_a = model->forward(std::span(a).subspan(10), alone_a, false);
    auto want_b = model->forward(b, alone_b, false);

    KvCache batch_a = model->new_cache(32), batch_b = model->new_cache(32);
    model->forward(std::span(a).first(10), batch_a, false);
    SequenceStep steps[] = {{std::span(a).subspan(10), &batch_a, LogitsWanted::Last}, {b, &batch_b, LogitsWanted::Last}};
    auto both = model->forward_batch(steps);
    const int64_t V = model->config().text.vocab_size;
    ASSERT_EQ(both.size(), 2u * V);
    EXPECT_EQ(std::vector<float>(both.begin(), both.begin() + V), want_a) << preset;
    EXPECT_EQ(std::vector<float>(both.begin() + V, both.end()), want_b) << preset;
    EXPECT_EQ(batch_b.length(), 7);
  }
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
  SynthOptions o = synth_options(tmp, "e2b-tiny", "m");
  o.fault_missing = "model.language_model.layers.3.mlp.up_proj.weight";
  synth_checkpoint(o);
  try {
    Gemma4Model::load(o.out, Precision::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
}

TEST(Gemma4Model, UnknownQuantizationSchemeNamesLayerAndScheme) {
  test::TempDir tmp;
  SynthOptions o = synth_options(tmp, "e2b-tiny", "q");
  o.format = CheckpointFormat::W4A16;
  synth_checkpoint(o);
  auto config = nlohmann::json::parse(std::ifstream(o.out / "config.json"));
  config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  std::ofstream(o.out / "config.json") << config.dump();
  try {
    Gemma4Model::load(o.out, Precision::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("layer 'model.language_model.per_layer_model_projection'"), std::string::npos) << what;
    EXPECT_NE(what.find("8-bit"), std::string::npos) << what;
  }
}

}  // namespace qs
