// synth -> repack -> verify on the reduced presets. The decisive check: repacking the bf16 synthetic
// checkpoint reproduces, byte for byte, the W4A16 checkpoint that synth packs directly from its known levels
// and steps (a path that never searches for a grid).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/inspect.h"
#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "checkpoint_tools/verify.h"
#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/gemma4_vision.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;

fs::path synth(const test::TempDir& tmp, const std::string& preset, CheckpointFormat format, const std::string& name,
               std::function<void(SynthOptions&)> tweak = {}) {
  SynthOptions o{.preset = preset, .format = format, .out = tmp / name};
  if (tweak) tweak(o);
  return test::synth_quietly(o);
}

RepackReport repack(const fs::path& src, const fs::path& dst, uint64_t max_shard_bytes = 4ull << 30) {
  RepackOptions o;
  o.src = src;
  o.dst = dst;
  o.progress = false;
  o.max_shard_bytes = max_shard_bytes;
  return repack_checkpoint(o);
}

VerifyResult verify(const fs::path& src, const fs::path& dst) {
  VerifyOptions o;
  o.src = src;
  o.dst = dst;
  o.progress = false;
  return verify_repack(o);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

bool same_bytes(const TensorRef& a, const TensorRef& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), a.nbytes()) == 0;
}

void expect_repack_equals_direct_pack(const std::string& preset) {
  test::TempDir tmp;
  auto src = synth(tmp, preset, CheckpointFormat::Bf16, "bf16");
  auto direct = synth(tmp, preset, CheckpointFormat::W4A16, "direct", [](SynthOptions& o) { o.lm_head = false; });
  repack(src, tmp / "repacked");
  Checkpoint a = Checkpoint::open(tmp / "repacked"), b = Checkpoint::open(direct);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& t : b.tensors()) {
    const TensorRef* r = a.find(t.name());
    ASSERT_NE(r, nullptr) << t.name();
    EXPECT_TRUE(same_bytes(*r, t)) << t.name();
  }
  auto ignore_a = read_json(tmp / "repacked/config.json")["quantization_config"]["ignore"];
  auto ignore_b = read_json(direct / "config.json")["quantization_config"]["ignore"];
  EXPECT_EQ(ignore_a, ignore_b);
}

}  // namespace

TEST(Synth, DeterministicFromSeed) {
  test::TempDir tmp;
  auto a = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "a");
  auto b = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "b");
  auto c = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "c", [](SynthOptions& o) { o.seed = 9; });
  Checkpoint ca = Checkpoint::open(a), cb = Checkpoint::open(b), cc = Checkpoint::open(c);
  const std::string emb = "model.language_model.embed_tokens.weight";
  EXPECT_TRUE(same_bytes(ca.get(emb), cb.get(emb)));
  EXPECT_FALSE(same_bytes(ca.get(emb), cc.get(emb)));
}

TEST(Synth, BF16ExportOmitsSharedKvTensors) {
  test::TempDir tmp;
  Checkpoint c = Checkpoint::open(synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "a"));
  EXPECT_NE(c.find("model.language_model.layers.3.self_attn.k_norm.weight"), nullptr);
  EXPECT_EQ(c.find("model.language_model.layers.4.self_attn.k_norm.weight"), nullptr);  // KV-shared
  EXPECT_EQ(c.find("model.language_model.layers.4.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(c.get("model.language_model.layers.5.mlp.gate_proj.weight").shape(), (std::vector<int64_t>{256, 64}));
}

TEST(Synth, W4A16ExportAsGoogleShipsIt) {
  test::TempDir tmp;
  auto dir = synth(tmp, "e2b-tiny", CheckpointFormat::W4A16, "q");
  Checkpoint c = Checkpoint::open(dir);
  EXPECT_NE(c.find("lm_head.weight"), nullptr);
  EXPECT_NE(c.find("model.language_model.per_layer_model_projection.weight_packed"), nullptr);
  EXPECT_NE(c.find("model.language_model.layers.0.per_layer_input_gate.weight_packed"), nullptr);
  auto q = read_json(dir / "config.json")["quantization_config"];
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["group_size"], 32);
  EXPECT_EQ(q["ignore"], nlohmann::json::array({"lm_head"}));
}

// Every tensor of a checkpoint: name -> dtype and shape.
std::map<std::string, std::pair<DType, std::vector<int64_t>>> layout(const fs::path& dir) {
  std::map<std::string, std::pair<DType, std::vector<int64_t>>> out;
  Checkpoint c = Checkpoint::open(dir);
  for (const TensorRef& t : c.tensors()) out[t.name()] = {t.dtype(), t.shape()};
  return out;
}

std::set<std::string> ignored(const fs::path& dir) {
  auto list = read_json(dir / "config.json")["quantization_config"]["ignore"].get<std::vector<std::string>>();
  return std::set<std::string>(list.begin(), list.end());
}

// The towers synth writes are the tensors transformers saved for the same configs (tests/fixtures/mm_*: names,
// dtypes, shapes; the w4a16 fixtures packed with compressed-tensors), in both formats: vision and audio
// (mm_e2b_like, the e2b-mm-tiny preset) and vision alone (mm_moe_like, by --config); its processor_config.json
// holds the image processor's settings as Gemma4Processor saved them.
TEST(Synth, TowersAreTheTensorsTransformersSaves) {
  test::TempDir tmp;
  const std::string fixtures = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/";
  for (const char* fixture : {"mm_e2b_like", "mm_moe_like"})
    for (auto [format, sub] : {std::pair{CheckpointFormat::Bf16, "bf16"}, std::pair{CheckpointFormat::W4A16, "w4a16"}}) {
      const fs::path ref = fs::path(fixtures) / fixture / sub;
      auto dir = synth(tmp, "", format, std::string(fixture) + sub, [&](SynthOptions& o) {
        o.config_file = ref / "config.json";
        o.lm_head = false;
      });
      EXPECT_EQ(layout(dir), layout(ref)) << fixture << " " << sub;
      if (format == CheckpointFormat::W4A16) {
        EXPECT_EQ(ignored(dir), ignored(ref)) << fixture;
      }
      // The image processor's settings, as transformers' Gemma4Processor saved them for the same config.
      const auto mine = read_json(dir / "processor_config.json"), theirs = read_json(ref / "processor_config.json");
      EXPECT_EQ(mine["image_processor"], theirs["image_processor"]) << fixture;
      EXPECT_EQ(mine["image_seq_length"], theirs["image_seq_length"]) << fixture;
      EXPECT_EQ(mine["processor_class"], theirs["processor_class"]) << fixture;
    }
}

// Three greedy drafts of `assistant` after a short prompt of `target` (what speculative decoding asks of it).
std::vector<int32_t> draft_after_prompt(const Gemma4Model& target, const Gemma4Assistant& assistant) {
  const std::vector<int32_t> prompt = {2, 17, 5, 33, 8, 11};
  KvCache cache = target.new_cache(16, 0, assistant.sliding_kept());
  std::vector<float> hidden;
  const SequenceStep step{prompt, &cache, LogitsWanted::Last, {}, 0, &hidden};
  const std::vector<float> logits = target.forward_batch(std::span(&step, 1));
  const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  return assistant.draft(hidden, next, cache, 3);
}

// Assistant drafters: synth writes the tensors transformers saved for the same configs (the assistant fixtures:
// tied and ordered-embeddings heads, beside the KV-sharing e2b_like and the non-sharing moe_like targets; w4a16
// packed by compressed-tensors), and what it writes loads through Gemma4Assistant beside the fixture's target
// (hidden size, vocabulary and each layer's K/V checked against it) and drafts.
TEST(Synth, AssistantsAreTheTensorsTransformersSavesAndLoadBesideTheirTargets) {
  test::TempDir tmp;
  const fs::path fixtures = fs::path(QATSERVE_SOURCE_DIR) / "tests/fixtures";
  for (const char* fixture : {"assistant_e2b_tied", "assistant_e2b_ordered", "assistant_moe_ordered"})
    for (auto [format, sub] : {std::pair{CheckpointFormat::Bf16, "bf16"}, std::pair{CheckpointFormat::W4A16, "w4a16"}}) {
      const fs::path ref = fixtures / fixture / sub;
      auto dir = synth(tmp, "", format, std::string(fixture) + sub,
                       [&](SynthOptions& o) { o.config_file = ref / "config.json"; });
      EXPECT_EQ(layout(dir), layout(ref)) << fixture << " " << sub;
      if (format == CheckpointFormat::W4A16) {
        EXPECT_EQ(ignored(dir), ignored(ref)) << fixture;
      }
      const std::string target_name = read_json(fixtures / fixture / "meta.json")["target"].get<std::string>();
      auto target = Gemma4Model::load(fixtures / target_name / sub, Precision::F32);
      auto assistant = Gemma4Assistant::load(dir, *target);
      EXPECT_EQ(draft_after_prompt(*target, *assistant).size(), 3u) << fixture << " " << sub;
    }
}

// The full-size assistant presets fit their targets' presets as Gemma4Assistant::load checks (backbone width,
// vocabulary, and per layer type the K/V heads and head_dim of the target's last K/V-computing layer of that type);
// the tiny pair is synthesised and loaded for real, and an assistant beside the wrong target is refused, named.
TEST(Synth, AssistantPresetsFitTheirTargets) {
  for (auto [name, target_name] : {std::pair{"e2b-assistant", "e2b"}, {"31b-assistant", "31b"},
                                   {"e2b-tiny-assistant", "e2b-tiny"}}) {
    const ModelConfig a = parse_model_config(preset_config_text(name), name);
    const ModelConfig t = parse_model_config(preset_config_text(target_name), target_name);
    ASSERT_TRUE(a.assistant) << name;
    EXPECT_EQ(a.assistant->backbone_hidden_size, t.text.hidden_size) << name;
    EXPECT_EQ(a.text.vocab_size, t.text.vocab_size) << name;
    for (int64_t l = 0; l < a.text.num_hidden_layers; ++l) {
      const int64_t src = t.text.last_kv_layer(a.text.layer_types[l]);
      ASSERT_GE(src, 0) << name << " layer " << l;
      EXPECT_EQ(a.text.layer_head_dim(l), t.text.layer_head_dim(src)) << name << " layer " << l;
      EXPECT_EQ(a.text.layer_kv_heads(l), t.text.layer_kv_heads(src)) << name << " layer " << l;
    }
  }
  test::TempDir tmp;
  for (auto format : {CheckpointFormat::Bf16, CheckpointFormat::W4A16}) {
    const std::string tag = format == CheckpointFormat::W4A16 ? "w4" : "bf16";
    auto target = Gemma4Model::load(synth(tmp, "e2b-tiny", format, "target-" + tag), Precision::BF16);
    const fs::path dir = synth(tmp, "e2b-tiny-assistant", format, "assistant-" + tag);
    EXPECT_EQ(draft_after_prompt(*target, *Gemma4Assistant::load(dir, *target)).size(), 3u) << tag;
    auto wrong = Gemma4Model::load(fs::path(QATSERVE_SOURCE_DIR) / "tests/fixtures/e2b_like/bf16", Precision::BF16);
    try {
      Gemma4Assistant::load(dir, *wrong);
      ADD_FAILURE() << "loaded beside a target of another vocabulary";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
    }
  }
}

TEST(Synth, TowersOnRequest) {
  test::TempDir tmp;
  auto has = [](const fs::path& dir, const std::string& name) { return Checkpoint::open(dir).find(name) != nullptr; };
  const std::string vision = "model.vision_tower.encoder.layers.1.mlp.down_proj.linear.weight";
  const std::string text = "model.language_model.embed_tokens.weight";
  auto none = synth(tmp, "e2b-mm-tiny", CheckpointFormat::Bf16, "none", [](SynthOptions& o) { o.towers = false; });
  EXPECT_FALSE(has(none, vision));
  EXPECT_TRUE(has(none, text));
  auto only = synth(tmp, "e2b-mm-tiny", CheckpointFormat::Bf16, "only", [](SynthOptions& o) { o.towers_only = true; });
  EXPECT_TRUE(has(only, vision));
  EXPECT_FALSE(has(only, text));
  EXPECT_FALSE(has(only, "lm_head.weight"));
  EXPECT_THROW(synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "x", [](SynthOptions& o) { o.towers_only = true; }),
               Error);  // e2b-tiny has no tower
}

// Towers kept bf16 in a w4a16 file (as a ct export may keep them): every tower linear on `ignore`, nothing packed,
// and the file verifies against the bf16 export (text packed, towers copied).
TEST(Synth, TowersBf16InW4a16AreOnIgnoreAndVerify) {
  test::TempDir tmp;
  auto src = synth(tmp, "e2b-mm-tiny", CheckpointFormat::Bf16, "bf16");
  auto q = synth(tmp, "e2b-mm-tiny", CheckpointFormat::W4A16, "q", [](SynthOptions& o) {
    o.towers_bf16 = true;
    o.lm_head = false;
  });
  Checkpoint c = Checkpoint::open(q);
  EXPECT_EQ(c.find("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight_packed"), nullptr);
  EXPECT_EQ(c.get("model.audio_tower.layers.1.self_attn.relative_k_proj.weight").dtype(), DType::BF16);
  auto ignore = read_json(q / "config.json")["quantization_config"]["ignore"];
  for (const char* m : {"model.vision_tower.encoder.layers.0.self_attn.q_proj.linear",
                        "model.audio_tower.layers.1.self_attn.relative_k_proj", "model.embed_vision.embedding_projection"})
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), m), ignore.end()) << m;
  VerifyResult v = verify(src, q);
  EXPECT_TRUE(v.ok()) << (v.first_failures.empty() ? "" : v.first_failures[0]);

  // The vision tower reads each linear as the file holds it (weight_packed where present, else weight): the bf16
  // export, the packed towers and the bf16 towers of a ct file give the same soft tokens (f32, lossless weights).
  auto packed = synth(tmp, "e2b-mm-tiny", CheckpointFormat::W4A16, "packed");
  std::vector<float> pixels(36 * 192);
  std::vector<int32_t> positions;
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(i % 251) / 250.0f;
  for (int32_t y = 0; y < 6; ++y)
    for (int32_t x = 0; x < 6; ++x) positions.insert(positions.end(), {x, y});
  auto encode = [&](const fs::path& dir) {
    Checkpoint ckpt = Checkpoint::open(dir);
    auto tower = Gemma4VisionTower::load(ckpt, read_model_config(dir / "config.json"), Precision::F32);
    return tower->encode({pixels, positions});
  };
  const std::vector<float> reference = encode(src);
  EXPECT_EQ(reference.size(), 4u * 64);  // 36 patches pooled 3 x 3: 4 soft tokens of the text width
  EXPECT_EQ(encode(q), reference);
  EXPECT_EQ(encode(packed), reference);
}

TEST(Repack, E2BTinyEqualsDirectPack) { expect_repack_equals_direct_pack("e2b-tiny"); }
// Tower linears too: repack finds their grid and packs them as synth does, the embedders' projections on `ignore`.
TEST(Repack, MultimodalTinyEqualsDirectPackTowersIncluded) { expect_repack_equals_direct_pack("e2b-mm-tiny"); }

// A tower the file holds is checked whole: a missing tower tensor is named.
TEST(Repack, NamesAMissingTowerTensor) {
  test::TempDir tmp;
  const std::string gone = "model.vision_tower.encoder.layers.1.self_attn.k_norm.weight";
  auto src = synth(tmp, "e2b-mm-tiny", CheckpointFormat::Bf16, "bf16", [&](SynthOptions& o) { o.fault_missing = gone; });
  try {
    repack(src, tmp / "q");
    ADD_FAILURE() << "repack accepted a tower without " << gone;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
  }
}
TEST(Repack, MoETinyEqualsDirectPackWithSplitExperts) { expect_repack_equals_direct_pack("26b-a4b-tiny"); }

// The 12B's family (gemma4_unified): dense, attention_k_eq_v, the encoder-free embedders copied untouched.
TEST(Repack, Unified12BTinyEqualsDirectPackAndVerifies) {
  expect_repack_equals_direct_pack("12b-tiny");
  test::TempDir tmp;
  auto src = synth(tmp, "12b-tiny", CheckpointFormat::Bf16, "bf16");
  repack(src, tmp / "int4");
  VerifyResult v = verify(src, tmp / "int4");
  EXPECT_TRUE(v.ok()) << (v.first_failures.empty() ? "" : v.first_failures.front());
  Checkpoint c = Checkpoint::open(tmp / "int4");
  EXPECT_NE(c.find("model.vision_embedder.pos_embedding"), nullptr);
  EXPECT_EQ(c.find("model.language_model.layers.5.self_attn.v_proj.weight_packed"), nullptr);  // k_eq_v full layer
  EXPECT_NE(c.find("model.language_model.layers.4.self_attn.v_proj.weight_packed"), nullptr);
}

// inspect reads the 12B's family: every expected tensor found, the embedders' 11 tensors counted as towers, nothing
// unknown, and the embedders' config reported.
TEST(Inspect, Unified12BTiny) {
  test::TempDir tmp;
  InspectOptions o;
  o.path = synth(tmp, "12b-tiny", CheckpointFormat::W4A16, "q");
  o.sample_groups = 4;
  auto r = inspect_checkpoint(o);
  EXPECT_EQ(r["config"]["model_type"], "gemma4_unified");
  const auto& a = r["architecture"];
  EXPECT_TRUE(a["missing"].empty()) << a["missing"].dump();
  EXPECT_TRUE(a["unknown_extras"].empty()) << a["unknown_extras"].dump();
  EXPECT_EQ(a["tower_tensors"].get<int64_t>(), 11);
  EXPECT_EQ(a["unified_embedders"]["image_patch_px"].get<int64_t>(), 48);
  EXPECT_EQ(a["unified_embedders"]["audio_frame_samples"].get<int64_t>(), 640);
  EXPECT_NE(format_inspection(r).find("encoder-free embedders: image 48-px patches -> 64 wide"), std::string::npos);
}

TEST(Repack, VerifiesLosslessAndBitIdentical) {
  test::TempDir tmp;
  auto src = synth(tmp, "26b-a4b-tiny", CheckpointFormat::Bf16, "bf16", [](SynthOptions& o) {
    o.max_shard_bytes = 256 << 10;  // several shards with an index
  });
  RepackReport r = repack(src, tmp / "q");
  EXPECT_TRUE(r.kept.empty());
  VerifyResult v = verify(src, tmp / "q");
  EXPECT_TRUE(v.ok()) << (v.first_failures.empty() ? "" : v.first_failures[0]);
  EXPECT_EQ(v.values_bit_identical, v.values_checked);
  Checkpoint q = Checkpoint::open(tmp / "q");
  const TensorRef& gate = q.get("model.language_model.layers.2.experts.7.gate_proj.weight_packed");
  EXPECT_EQ(gate.shape(), (std::vector<int64_t>{32, 8}));  // [moe_intermediate, hidden / 8]
  EXPECT_EQ(q.get("model.language_model.layers.2.experts.7.down_proj.weight_scale").shape(),
            (std::vector<int64_t>{64, 1}));
  auto ignore = read_json(tmp / "q/config.json")["quantization_config"]["ignore"];
  EXPECT_NE(std::find(ignore.begin(), ignore.end(), "model.language_model.layers.0.router.proj"), ignore.end());
}

// Shards of copied tensors alone are written on their own thread beside the others (tensor_stream.cc): with
// small shards many are, and the output must still be the one-shard repack's tensors, byte for byte.
TEST(Repack, CopyOnlyShardsWrittenBesideTheRestGiveTheSameTensors) {
  test::TempDir tmp;
  auto src = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "bf16");
  repack(src, tmp / "one");
  repack(src, tmp / "many", 64 << 10);
  Checkpoint one = Checkpoint::open(tmp / "one"), many = Checkpoint::open(tmp / "many");
  const auto index = read_json(tmp / "many/model.safetensors.index.json")["weight_map"];
  std::map<std::string, bool> shard_copies_only;  // per shard file: whether it holds copied tensors only
  for (const auto& [name, file] : index.items()) {
    const bool quantized = name.ends_with(".weight_packed") || name.ends_with(".weight_scale") ||
                           name.ends_with(".weight_shape");
    auto [it, fresh] = shard_copies_only.try_emplace(file.get<std::string>(), !quantized);
    if (!fresh) it->second = it->second && !quantized;
  }
  EXPECT_GE(std::count_if(shard_copies_only.begin(), shard_copies_only.end(), [](auto& s) { return s.second; }), 2);
  EXPECT_GE(std::count_if(shard_copies_only.begin(), shard_copies_only.end(), [](auto& s) { return !s.second; }), 2);
  ASSERT_EQ(one.tensors().size(), many.tensors().size());
  for (const TensorRef& t : one.tensors()) {
    const TensorRef& m = many.get(t.name());
    ASSERT_EQ(m.nbytes(), t.nbytes()) << t.name();
    EXPECT_EQ(std::memcmp(m.bytes().data(), t.bytes().data(), t.nbytes()), 0) << t.name();
  }
  EXPECT_TRUE(verify(src, tmp / "many").ok());
}

TEST(Repack, DropsRedundantTiedLmHead) {
  test::TempDir tmp;
  auto src = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "bf16", [](SynthOptions& o) { o.lm_head = true; });
  RepackReport r = repack(src, tmp / "q");
  EXPECT_EQ(r.dropped, std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(Checkpoint::open(tmp / "q").find("lm_head.weight"), nullptr);
  EXPECT_TRUE(verify(src, tmp / "q").ok());
}

TEST(Repack, OffGridTensorStaysBf16WithItsFusedPartners) {
  test::TempDir tmp;
  const std::string q_proj = "model.language_model.layers.1.self_attn.q_proj.weight";
  auto src = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "bf16", [&](SynthOptions& o) { o.fault_off_grid = q_proj; });
  RepackReport r = repack(src, tmp / "q");
  ASSERT_EQ(r.kept.size(), 3u);  // q_proj off grid; k_proj and v_proj load fused with it in vLLM
  std::map<std::string, std::string> kept;
  for (const auto& k : r.kept) kept[k.name] = k.reason;
  EXPECT_NE(kept[q_proj].find("row 0 group 0"), std::string::npos) << kept[q_proj];
  EXPECT_NE(kept["model.language_model.layers.1.self_attn.k_proj.weight"].find("fused"), std::string::npos);
  Checkpoint q = Checkpoint::open(tmp / "q");
  EXPECT_EQ(q.get(q_proj).dtype(), DType::BF16);
  EXPECT_NE(q.find("model.language_model.layers.1.self_attn.o_proj.weight_packed"), nullptr);
  auto ignore = read_json(tmp / "q/config.json")["quantization_config"]["ignore"];
  EXPECT_NE(std::find(ignore.begin(), ignore.end(), "model.language_model.layers.1.self_attn.v_proj"), ignore.end());
  EXPECT_TRUE(verify(src, tmp / "q").ok());
}

TEST(Repack, RefusesAnAlreadyQuantizedSource) {
  test::TempDir tmp;
  auto src = synth(tmp, "e2b-tiny", CheckpointFormat::W4A16, "q");
  EXPECT_THROW(repack(src, tmp / "qq"), Error);
  EXPECT_FALSE(fs::exists(tmp / "qq"));
}

TEST(Verify, CatchesAChangedScale) {
  test::TempDir tmp;
  auto src = synth(tmp, "e2b-tiny", CheckpointFormat::Bf16, "bf16");
  repack(src, tmp / "q");
  {
    Checkpoint q = Checkpoint::open(tmp / "q");
    const auto& shard = *q.shards()[0];
    const TensorEntry* e = shard.find("model.language_model.layers.2.mlp.down_proj.weight_scale");
    uint64_t data_bytes = 0;
    for (const auto& t : shard.tensors()) data_bytes += t.nbytes();
    uint64_t offset = shard.file_size() - data_bytes + e->begin;
    std::fstream f(shard.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset + 2 * 5 + 1));  // high byte of scale 5 = row 1 group 1 (4 groups a row)
    char c = 0x3e;
    f.write(&c, 1);
  }
  VerifyResult v = verify(src, tmp / "q");
  EXPECT_FALSE(v.ok());
  ASSERT_FALSE(v.first_failures.empty());
  EXPECT_NE(v.first_failures[0].find("layers.2.mlp.down_proj' row 1 group 1"), std::string::npos)
      << v.first_failures[0];
}

namespace {

std::string base64(const std::string& bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint8_t(bytes[i + 2]);
    for (size_t k = 0; k < 4; ++k) out += i + k <= bytes.size() ? kDigits[(n >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

}  // namespace

// The command line end to end on a synthetic multimodal checkpoint: synth (with the fixture's tokenizer, template
// and processor config) -> repack -> verify -> `logits --messages` with an image and an audio clip. The lossless
// repack gives the same tokens and bit-identical f32 logits.
TEST(SynthCli, MultimodalTinyThroughRepackVerifyAndLogits) {
  test::TempDir tmp;
  const fs::path fixture = fs::path(QATSERVE_SOURCE_DIR) / "tests/fixtures/mm_e2b_like";
  fs::create_directories(tmp / "tok");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"})
    fs::copy_file(fixture / "bf16" / f, tmp / "tok" / f);
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  nlohmann::json parts = nlohmann::json::array(
      {{{"type", "text"}, {"text", "What is this?"}},
       {{"type", "image_url"},
        {"image_url", {{"url", "data:image/png;base64," + base64(read(fixture / "media/odd_45x71.png"))}}}},
       {{"type", "input_audio"},
        {"input_audio", {{"data", base64(read(fixture / "media/chirp_0.6s.wav"))}, {"format", "wav"}}}}});
  std::ofstream(tmp / "m.json") << nlohmann::json{{"messages", {{{"role", "user"}, {"content", parts}}}}}.dump();
  const std::string t = "'" + tmp.path().string() + "/";
  for (const std::string& args :
       {"synth --preset e2b-mm-tiny --format bf16 --quiet --tokenizer " + t + "tok' --out " + t + "bf16'",
        "repack " + t + "bf16' " + t + "q' --quiet", "verify " + t + "bf16' " + t + "q'",
        "logits --precision f32 --model " + t + "bf16' --messages " + t + "m.json' --out " + t + "a.safetensors'",
        "logits --precision f32 --model " + t + "q' --messages " + t + "m.json' --out " + t + "b.safetensors'"}) {
    test::CliResult r = test::qatserve(args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  }
  Checkpoint a = Checkpoint::open(tmp / "a.safetensors"), b = Checkpoint::open(tmp / "b.safetensors");
  EXPECT_TRUE(same_bytes(a.get("tokens"), b.get("tokens")));
  EXPECT_TRUE(same_bytes(a.get("logits"), b.get("logits")));
  // The image's and the clip's soft-token placeholders are in the prompt (image_token_id 19, audio_token_id 22).
  const TensorRef& tokens = a.get("tokens");
  const auto* ids = reinterpret_cast<const int32_t*>(tokens.bytes().data());
  const int64_t image = std::count(ids, ids + tokens.shape()[0], 19), audio = std::count(ids, ids + tokens.shape()[0], 22);
  EXPECT_GT(image, 0);
  EXPECT_GT(audio, 0);
}

}  // namespace qs
