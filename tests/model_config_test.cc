#include "formats/model_config.h"

#include <gtest/gtest.h>

#include "checkpoint_tools/synth.h"
#include "util/error.h"

namespace qs {
namespace {
ModelConfig preset(const std::string& name) { return parse_model_config(preset_config_text(name), name); }
}  // namespace

TEST(ModelConfig, E2BDerivedFacts) {
  ModelConfig m = preset("e2b");
  const auto& c = m.text;
  EXPECT_EQ(m.model_type, "gemma4");
  EXPECT_EQ(m.text_prefix(), "model.language_model.");
  EXPECT_EQ(c.hidden_size, 1536);
  EXPECT_EQ(c.first_shared_layer(), 15);
  EXPECT_EQ(c.kv_source(14), 14);
  EXPECT_EQ(c.kv_source(15), 13);  // sliding shared layers read the last non-shared sliding layer
  EXPECT_EQ(c.kv_source(19), 14);  // full shared layers read layer 14
  EXPECT_EQ(c.kv_source(34), 14);
  EXPECT_EQ(c.layer_intermediate(14), 6144);
  EXPECT_EQ(c.layer_intermediate(15), 12288);  // double-wide MLP on KV-shared layers
  EXPECT_EQ(c.layer_head_dim(4), 512);
  EXPECT_EQ(c.layer_kv_heads(4), 1);
  EXPECT_TRUE(c.layer_has_v_proj(4));
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_TRUE(m.has_vision);
}

TEST(ModelConfig, MoEAndKEqV) {
  const auto& c = preset("26b-a4b").text;
  EXPECT_TRUE(c.enable_moe_block);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 704);
  EXPECT_EQ(c.layer_kv_heads(5), 2);  // full layers: num_global_key_value_heads
  EXPECT_EQ(c.layer_kv_heads(0), 8);
  EXPECT_FALSE(c.layer_has_v_proj(5));  // attention_k_eq_v: V is the raw k projection
  EXPECT_TRUE(c.layer_has_v_proj(0));
  EXPECT_EQ(preset("31b").text.layer_kv_heads(5), 4);
}

// Google's 12B config (../shared/configs/gemma-4-12B-it-qat-w4a16-ct.json, compiled in as preset "12b" without its
// quantization_config): transformers' gemma4_unified, read as a variant of the one Gemma 4 family.
TEST(ModelConfig, Unified12BDerivedFacts) {
  ModelConfig m = preset("12b");
  const auto& c = m.text;
  EXPECT_EQ(m.model_type, "gemma4_unified");
  EXPECT_TRUE(m.is_unified());
  EXPECT_EQ(m.text_prefix(), "model.language_model.");
  EXPECT_EQ(c.hidden_size, 3840);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_FALSE(c.has_ple());
  EXPECT_FALSE(c.enable_moe_block);
  EXPECT_EQ(c.num_kv_shared_layers, 0);
  EXPECT_EQ(c.kv_source(47), 47);
  EXPECT_TRUE(c.is_full(5));
  EXPECT_FALSE(c.is_full(4));
  EXPECT_TRUE(c.is_full(47));
  EXPECT_EQ(c.layer_head_dim(5), 512);
  EXPECT_EQ(c.layer_head_dim(4), 256);
  EXPECT_EQ(c.layer_kv_heads(5), 1);  // full layers: num_global_key_value_heads
  EXPECT_EQ(c.layer_kv_heads(4), 8);
  EXPECT_FALSE(c.layer_has_v_proj(5));  // attention_k_eq_v
  EXPECT_EQ(c.layer_intermediate(40), 15360);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_TRUE(c.bidirectional_vision);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_TRUE(m.has_vision);
  EXPECT_TRUE(m.has_audio);
  EXPECT_FALSE(m.vision);  // no vision tower
  ASSERT_TRUE(m.unified_vision);
  EXPECT_EQ(m.unified_vision->model_patch_size(), 48);
  EXPECT_EQ(m.unified_vision->patch_values(), 6912);
  EXPECT_EQ(m.unified_vision->mm_posemb_size, 1120);
  ASSERT_TRUE(m.unified_audio);
  EXPECT_EQ(m.unified_audio->audio_embed_dim, 640);
}

TEST(ModelConfig, UnifiedDefaultsAndRefusals) {
  const std::string base = R"({"model_type":"gemma4_unified_text","vocab_size":99,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16)";
  ModelConfig m = parse_model_config(base + "}", "u");
  EXPECT_EQ(m.text_prefix(), "model.");
  EXPECT_TRUE(m.is_unified());
  EXPECT_EQ(m.text.sliding_window, 1024);   // Gemma4UnifiedTextConfig's defaults, not gemma4's
  EXPECT_TRUE(m.text.bidirectional_vision);
  EXPECT_EQ(m.text.max_position_embeddings, 262144);
  EXPECT_FALSE(m.text.has_ple());
  for (const char* bad : {R"(,"hidden_size_per_layer_input":256})", R"(,"enable_moe_block":true})"}) {
    try {
      parse_model_config(base + bad, "u.json");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gemma4_unified has no"), std::string::npos) << e.what();
    }
  }
  try {
    parse_model_config(base + R"(,"use_bidirectional_attention":"all"})", "u.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'use_bidirectional_attention' is \"all\""), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, EveryPresetParses) {
  for (const auto& name : synth_preset_names()) EXPECT_NO_THROW(preset(name)) << name;
}

TEST(ModelConfig, TextOnlyModelType) {
  ModelConfig m = parse_model_config(R"({"model_type":"gemma4_text","vocab_size":99,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16})",
                                     "t");
  EXPECT_EQ(m.text_prefix(), "model.");
  EXPECT_EQ(m.text.global_head_dim, 512);  // transformers' default when absent
  EXPECT_TRUE(m.text.is_full(1));          // last layer forced full
}

TEST(ModelConfig, IgnoreUsesAnchoredRegexAndExactNames) {
  ModelConfig m = parse_model_config(R"({"model_type":"gemma4_text","vocab_size":99,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
      "quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized",
        "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,
          "strategy":"group","group_size":32}}},
        "ignore":["lm_head","re:.*router\\.proj$","re:vision"]}})",
                                     "t");
  const auto& q = *m.quantization;
  EXPECT_EQ(q.unsupported_reason(), "");
  EXPECT_TRUE(q.ignores("lm_head"));
  EXPECT_FALSE(q.ignores("lm_head2"));
  EXPECT_TRUE(q.ignores("model.layers.3.router.proj"));
  EXPECT_TRUE(q.ignores("vision_tower.x"));           // re.match: anchored at the start only
  EXPECT_FALSE(q.ignores("model.vision_tower.x"));
}

TEST(ModelConfig, UnsupportedSchemeIsNamed) {
  ModelConfig m = parse_model_config(R"({"model_type":"gemma4_text","vocab_size":99,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
      "quantization_config":{"quant_method":"compressed-tensors","format":"float-quantized",
        "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float"}}}}})",
                                     "t");
  EXPECT_NE(m.quantization->unsupported_reason().find("float-quantized"), std::string::npos);
}

}  // namespace qs
