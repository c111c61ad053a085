#pragma once
// config.json for Gemma 4: the multimodal wrapper (model_type "gemma4", text fields under text_config) and
// the text-only "gemma4_text", plus a compressed-tensors quantization_config. The 12B ("gemma4_unified" /
// "gemma4_unified_text", transformers' models/gemma4_unified/) is a variant of the same family: gemma4's text math
// without per-layer embeddings and MoE, and encoder-free image/audio embedders instead of towers. Derived per-layer
// facts (KV sharing donor, head dim, KV heads, MLP width) live here so every tool reads them the same way.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

enum class LayerType { Sliding, Full };

struct QuantizationScheme {
  std::string name;  // config_groups key
  std::vector<std::string> targets;
  std::string format;  // pack-quantized
  int num_bits = 0;
  std::string type;      // int | float
  std::string strategy;  // group | channel | ...
  bool symmetric = true;
  int64_t group_size = 0;
  bool has_input_activations = false;
  std::string actorder;  // empty when null
};

struct CompressedTensorsConfig {
  std::string quant_method;
  std::string format;
  std::vector<QuantizationScheme> schemes;
  std::vector<std::string> ignore;

  // vLLM semantics: "re:" entries are regexes anchored at the start (Python re.match), others exact names.
  bool ignores(std::string_view module) const;
  // Whether qatserve can read this scheme: symmetric int4 pack-quantized with groups along the input.
  // Returns an empty string when it can, else what is unsupported.
  std::string unsupported_reason() const;
  int64_t group_size() const { return schemes.empty() ? 0 : schemes.front().group_size; }
};

struct Gemma4TextConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, num_global_key_value_heads = 0;
  int64_t head_dim = 0, global_head_dim = 512;
  bool attention_k_eq_v = false;
  double rms_norm_eps = 1e-6;
  int64_t sliding_window = 512;
  std::vector<LayerType> layer_types;
  double rope_theta_sliding = 1e4, rope_theta_full = 1e6, partial_rotary_factor_full = 0.25;
  std::string rope_type_sliding = "default", rope_type_full = "proportional";
  double final_logit_softcapping = 0;  // 0 = none
  int64_t vocab_size_per_layer_input = 0, hidden_size_per_layer_input = 0;
  int64_t num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  bool enable_moe_block = false;
  int64_t num_experts = 0, top_k_experts = 0, moe_intermediate_size = 0;
  bool tie_word_embeddings = true;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int64_t pad_token_id = 0, bos_token_id = 2;
  std::vector<int64_t> eos_token_ids;
  // use_bidirectional_attention == "vision": on sliding layers an image's soft tokens also see each other forward.
  bool bidirectional_vision = false;
  // gemma4_unified with "vision": its model's forward (transformers 5.23's Gemma4UnifiedModel, which builds the masks
  // with masking_utils.create_masks_for_generate and the image blocks) makes an image's block bidirectional on full
  // layers too, and on sliding layers ORs it with the window (the whole block is seen however long), where gemma4
  // keeps full layers causal and cuts blocks by the window.
  bool vision_blocks_on_all_layers = false;

  int64_t max_position_embeddings = 0;  // 0 when the config does not say
  int64_t max_position_embeddings_or(int64_t fallback) const {
    return max_position_embeddings > 0 ? max_position_embeddings : fallback;
  }

  bool has_ple() const { return hidden_size_per_layer_input > 0; }
  bool is_full(int64_t l) const { return layer_types[l] == LayerType::Full; }
  int64_t first_shared_layer() const { return num_hidden_layers - num_kv_shared_layers; }
  bool is_kv_shared(int64_t l) const { return num_kv_shared_layers > 0 && l >= first_shared_layer(); }
  // The layer whose K/V layer l attends over: itself, or the last non-shared layer of the same type.
  int64_t kv_source(int64_t l) const;
  // The last layer of this type that computes K/V (-1: none): what KV-shared layers and assistant drafters read.
  int64_t last_kv_layer(LayerType type) const;
  int64_t layer_head_dim(int64_t l) const { return is_full(l) ? global_head_dim : head_dim; }
  int64_t layer_kv_heads(int64_t l) const;
  bool layer_has_v_proj(int64_t l) const { return !(attention_k_eq_v && is_full(l)); }
  int64_t layer_intermediate(int64_t l) const;
};

// vision_config of the multimodal wrapper (transformers' Gemma4VisionConfig) and the wrapper's image token ids.
struct Gemma4VisionConfig {
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0;
  int64_t num_key_value_heads = 0, head_dim = 0;
  int64_t patch_size = 16, pooling_kernel_size = 3, position_embedding_size = 10240;
  double rms_norm_eps = 1e-6, rope_theta = 100;
  bool use_clipped_linears = false, standardize = false;
  int64_t image_token_id = -1, boi_token_id = -1, eoi_token_id = -1;
  int64_t soft_tokens_per_image = 280;  // the wrapper's vision_soft_tokens_per_image: the processor's budget

  int64_t patch_values() const { return 3 * patch_size * patch_size; }  // one patch's pixel values (RGB)
};

// vision_config / audio_config of a "gemma4_unified" config (the 12B): no towers, encoder-free embedders
// (transformers' Gemma4UnifiedVisionConfig / Gemma4UnifiedAudioConfig).
struct Gemma4UnifiedVisionConfig {
  int64_t patch_size = 16, pooling_kernel_size = 3, mm_embed_dim = 3840, mm_posemb_size = 1120;
  double rms_norm_eps = 1e-6;
  int64_t model_patch_size() const { return patch_size * pooling_kernel_size; }  // 48 px
  int64_t patch_values() const { return 3 * model_patch_size() * model_patch_size(); }
};
struct Gemma4UnifiedAudioConfig {
  int64_t audio_embed_dim = 640;  // = samples per soft token (40 ms at 16 kHz)
  double rms_norm_eps = 1e-6;
};

// Which transformers module a config belongs to (one model family, variants by config).
enum class ModelFamily { Gemma4, Gemma4Unified };

// An assistant drafter's own fields (model_type gemma4_assistant / gemma4_unified_assistant; transformers'
// Gemma4AssistantConfig). Its decoder, text_config, computes no K/V: every layer reads its target's.
struct Gemma4AssistantConfig {
  int64_t backbone_hidden_size = 0;  // the target's hidden size
  bool use_ordered_embeddings = false;  // the masked head: centroid scores pick clusters of the vocabulary
  int64_t num_centroids = 2048, centroid_intermediate_top_k = 32;
  int64_t tokens_per_centroid(int64_t vocab) const { return vocab / num_centroids; }
};

struct ModelConfig {
  std::string model_type;  // gemma4 | gemma4_text | gemma4_unified | gemma4_unified_text | gemma4_assistant |
                           // gemma4_unified_assistant
  ModelFamily family = ModelFamily::Gemma4;
  Gemma4TextConfig text;
  std::optional<Gemma4AssistantConfig> assistant;  // set for the assistant model types
  bool has_vision = false, has_audio = false;
  std::optional<Gemma4VisionConfig> vision;  // gemma4 with vision_config: the vision tower
  std::optional<Gemma4UnifiedVisionConfig> unified_vision;  // gemma4_unified with vision_config
  std::optional<Gemma4UnifiedAudioConfig> unified_audio;    // gemma4_unified with audio_config
  std::optional<CompressedTensorsConfig> quantization;
  nlohmann::ordered_json raw;

  bool is_unified() const { return family == ModelFamily::Gemma4Unified; }
  // The multimodal wrapper (text fields under text_config) rather than a text-only config.
  bool is_wrapper() const { return model_type == "gemma4" || model_type == "gemma4_unified"; }
  // Name prefix of the text decoder's tensors in a checkpoint of this config.
  std::string text_prefix() const { return is_wrapper() ? "model.language_model." : "model."; }
};

// audio_config of a "gemma4" config (E2B/E4B): a conformer over log-mel frames (transformers' Gemma4AudioConfig;
// absent fields take its defaults, which are E2B's values).
struct Gemma4AudioConfig {
  int64_t hidden_size = 1024, num_hidden_layers = 12, num_attention_heads = 8;
  int64_t subsampling_conv_channels[2] = {128, 32};
  int64_t conv_kernel_size = 5;
  int64_t attention_chunk_size = 12, attention_context_left = 13, attention_context_right = 0;
  double attention_logit_cap = 50, attention_invalid_logits_value = -1e9;
  double residual_weight = 0.5, rms_norm_eps = 1e-6, gradient_clipping = 1e10;
  bool use_clipped_linears = true;
  int64_t output_proj_dims = 1536;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Keys one chunk of queries sees: the chunk, attention_context_left - 1 before it, attention_context_right after.
  int64_t context_size() const { return attention_chunk_size + attention_context_left - 1 + attention_context_right; }
  // The subsampling's input_proj_linear input: (channels[0] / 4) x channels[1], the mel bins / 4 times channels.
  int64_t projection_input() const { return subsampling_conv_channels[0] / 4 * subsampling_conv_channels[1]; }
};
// Throws, naming the field, when the config has no audio_config or a value is malformed.
Gemma4AudioConfig parse_audio_config(const ModelConfig& config, std::string_view label);

ModelConfig parse_model_config(std::string_view json_text, std::string_view label);
ModelConfig read_model_config(const std::filesystem::path& path);

std::string_view layer_type_name(LayerType t);

// The quantization_config block of a symmetric int4 group-wise pack-quantized (W4A16) checkpoint, in the
// shape Google's -qat-w4a16-ct files carry, with `ignore` listing the Linear modules kept in float.
nlohmann::ordered_json w4a16_quantization_config(const std::vector<std::string>& ignore, int64_t group_size);

}  // namespace qs
