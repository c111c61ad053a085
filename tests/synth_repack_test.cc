// synth -> repack -> verify on the reduced presets. The decisive check: repacking the bf16 synthetic
// checkpoint reproduces, byte for byte, the W4A16 checkpoint that synth packs directly from its known levels
// and steps (a path that never searches for a grid).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/inspect.h"
#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "checkpoint_tools/verify.h"
#include "formats/checkpoint.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;

fs::path synth(const test::TempDir& tmp, const std::string& preset, CheckpointFormat format, const std::string& name,
               std::function<void(SynthOptions&)> tweak = {}) {
  SynthOptions o;
  o.preset = preset;
  o.format = format;
  o.out = tmp / name;
  o.progress = false;
  if (tweak) tweak(o);
  synth_checkpoint(o);
  return o.out;
}

RepackReport repack(const fs::path& src, const fs::path& dst) {
  RepackOptions o;
  o.src = src;
  o.dst = dst;
  o.progress = false;
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

TEST(Repack, E2BTinyEqualsDirectPack) { expect_repack_equals_direct_pack("e2b-tiny"); }
TEST(Repack, MoETinyEqualsDirectPackWithSplitExperts) { expect_repack_equals_direct_pack("26b-a4b-tiny"); }

// The 12B's family (gemma4_unified): dense, attention_k_eq_v, encoder-free embedder stand-ins copied untouched.
TEST(Repack, Unified12BTinyEqualsDirectPackAndVerifies) {
  expect_repack_equals_direct_pack("12b-tiny");
  test::TempDir tmp;
  auto src = synth(tmp, "12b-tiny", CheckpointFormat::Bf16, "bf16");
  repack(src, tmp / "int4");
  VerifyResult v = verify(src, tmp / "int4");
  EXPECT_TRUE(v.ok()) << (v.first_failures.empty() ? "" : v.first_failures.front());
  Checkpoint c = Checkpoint::open(tmp / "int4");
  EXPECT_NE(c.find("model.embed_vision.pos_embedding"), nullptr);
  EXPECT_EQ(c.find("model.language_model.layers.5.self_attn.v_proj.weight_packed"), nullptr);  // k_eq_v full layer
  EXPECT_NE(c.find("model.language_model.layers.4.self_attn.v_proj.weight_packed"), nullptr);
}

// inspect reads the 12B's family: every expected tensor found, the embedder stand-ins counted as towers, nothing
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
  EXPECT_EQ(a["tower_tensors"].get<int64_t>(), 4);
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

}  // namespace qs
