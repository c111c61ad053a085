#pragma once
// Model configs compiled into the binary: the real Gemma 4 configs (e2b, e4b, 26b-a4b, 31b) and reduced
// ones of the same structure for tests (e2b-tiny, 26b-a4b-tiny: text only; e2b-mm-tiny: the mm_e2b_like fixture's
// config, with tiny vision and audio towers). Sources: configs/*.json. The 26b-a4b and 31b vision_config (a
// 1152-wide, 27-layer tower, head_dim 72, MLP 4304, standardized, no clipped linears) is reconstructed from
// third-party ports, not a copy of Google's file (the shared reconstructed configs carry none).
//
// Assistant drafters (model_type gemma4_assistant; no real assistant config is in ../shared/configs, so each number
// is derived, and `synth` of these presets measures speed only, never agreement):
//   e2b-assistant  beside e2b. From the target (configs/e2b.json): backbone_hidden_size 1536, vocab 262144, the
//                  K/V the layers read (sliding: 1 KV head x 256; full: 1 x 512), sliding_window 512, rope
//                  parameters. From third-party descriptions of google/gemma-4-E2B-it-assistant: 4 layers of width
//                  256, use_ordered_embeddings with 2048 centroids and top-k 32 (transformers' Gemma4AssistantConfig
//                  defaults), an int64 token_ordering of the vocabulary, 151 MB in bf16. Chosen to match that size
//                  (this preset writes 151.3 MB in bf16): 3 sliding layers then 1 full one (the E2B ratio),
//                  4 query heads, MLP 1024 (4 x width, as the E2B's 6144 = 4 x 1536).
//   31b-assistant  beside 31b: backbone_hidden_size 5376, and the K/V of configs/31b.json (sliding: 16 KV heads x
//                  256; full: 4 x 512, attention_k_eq_v), sliding_window 1024; 32 query heads as the target's.
//                  Not published where we could read it: the 4 x 256 layers, MLP and ordered head of e2b-assistant.
//   e2b-tiny-assistant  beside e2b-tiny (tests): its K/V shapes and vocabulary, 64 centroids of 64 tokens, top-k 8.
#include <string_view>
#include <vector>

namespace qs {

struct PresetConfig {
  std::string_view name;
  std::string_view json;
};

const std::vector<PresetConfig>& preset_configs();

}  // namespace qs
