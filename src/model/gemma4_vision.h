#pragma once
// The Gemma 4 vision encoder and its multimodal embedder: one image's patches (as the processor gives them) to soft
// tokens in the text model's hidden space, which Gemma4Model::forward_batch places at the image's placeholder
// tokens (SoftTokens). Names follow transformers' modeling_gemma4.py: Gemma4VisionPatchEmbedder (linear patch
// projection + a learned x and y position table), Gemma4VisionEncoderLayer (RMSNorm sandwich attention with q/k
// norms, 2-D rotary positions and a weightless v norm, bidirectional over the image; gated gelu MLP), the pooler
// (mean over k x k patches, times sqrt(hidden), standardized where the config says), and Gemma4MultimodalEmbedder
// (weightless RMSNorm, then a projection to the text width). Weights from either QAT format, per tensor as the file
// holds them, through the text model's linear kernels; every patch of the image is one row of each linear.
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "formats/model_config.h"
#include "kernels/linear.h"
#include "model/clippable_linear.h"
#include "model/gemma4.h"
#include "model/gemma4_multimodal_embedder.h"
#include "util/huge_buffer.h"

namespace qs {

class LoraAdapter;
class ThreadPool;

struct Gemma4VisionLayer {
  std::vector<float> input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  ClippableLinear q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;
  ClippableLinear gate_proj, up_proj, down_proj;
};

// One image as Gemma4ImageProcessor gives it: pixel values in [0, 1] per patch (channel-minor, 3 x patch^2 each)
// and each patch's (x, y) on the patch grid; (-1, -1) marks padding, which changes nothing and is skipped.
struct ImagePatches {
  std::span<const float> pixel_values;   // [patches, 3 * patch_size^2]
  std::span<const int32_t> position_ids;  // [patches, 2]
};

class Gemma4VisionTower {
 public:
  // The tower of the text model's checkpoint (model.vision_tower.*, model.embed_vision.*), run in its precision
  // (Int8 runs the tower as BF16). Throws, naming the tensor, when one is missing or misshapen.
  static std::unique_ptr<Gemma4VisionTower> load(const Gemma4Model& text);
  // The same from a checkpoint and its config alone (the text decoder need not be loaded, or present).
  static std::unique_ptr<Gemma4VisionTower> load(const Checkpoint& checkpoint, const ModelConfig& config,
                                                 Precision precision);

  const Gemma4VisionConfig& config() const { return config_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  bool int4_weights() const { return int4_; }
  // Soft tokens an image of these positions becomes: its real patches / pooling_kernel_size^2.
  int64_t soft_tokens(std::span<const int32_t> position_ids) const;
  // The image's soft tokens, [soft_tokens, text hidden] (transformers' get_image_features pooler output).
  // With `lora`, the adapter's A and B for the tower's linears (LoraAdapter::find_tower) join them, as PEFT's.
  std::vector<float> encode(const ImagePatches& image, const LoraAdapter* lora = nullptr) const;

 private:
  struct Scratch;
  Gemma4VisionTower() = default;
  void attention(const Gemma4VisionLayer& layer, Scratch& s) const;
  void mlp(const Gemma4VisionLayer& layer, Scratch& s) const;
  void pool(Scratch& s, std::span<const int32_t> position_ids, std::vector<float>& out) const;
  void rope(std::vector<float>& x, int64_t heads, const Scratch& s) const;
  void linears(std::initializer_list<std::pair<const ClippableLinear*, std::vector<float>*>> wy,
               std::vector<float>& x, int64_t rows, const LoraAdapter* lora) const;
  void norm(std::vector<float>& x, int64_t n, const std::vector<float>& weight) const;
  void round(std::span<float> x) const;

  Gemma4VisionConfig config_;
  int64_t text_hidden_ = 0;
  Precision precision_ = Precision::F32;
  ThreadPool* pool_ = nullptr;
  ClippableLinear input_proj_;  // a plain nn.Linear: never clipped
  Gemma4MultimodalEmbedder embed_vision_;
  std::vector<float> position_embedding_table_;  // [2, position_embedding_size, hidden]: x rows, then y rows
  std::vector<Gemma4VisionLayer> layers_;
  std::vector<float> std_bias_, std_scale_;  // standardize
  std::vector<float> inv_freq_;              // head_dim / 4 frequencies, shared by the x and y halves
  std::vector<HugeBuffer> int4_storage_;
  uint64_t weight_bytes_ = 0;
  bool int4_ = false;
};

}  // namespace qs
