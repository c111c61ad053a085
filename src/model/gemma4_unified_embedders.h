#pragma once
// The 12B's (transformers' gemma4_unified) encoder-free embedders: no vision or audio tower, the soft tokens come
// straight from the pixels and the waveform. Names follow modeling_gemma4_unified.py:
//   Gemma4UnifiedVisionEmbedder: each merged patch (patch_size x pooling_kernel_size pixels square, the
//     processor's raster order) -> patch_ln1 (LayerNorm) -> patch_dense (Linear + bias) -> patch_ln2 -> + the
//     factorized 2-D position table (pos_embedding[x][0] + pos_embedding[y][1]) -> pos_norm (LayerNorm) ->
//     multimodal_embedder (weightless RMSNorm, embedding_projection to the text width);
//   embed_audio (Gemma4UnifiedMultimodalEmbedder): each frame of audio_embed_dim (640) samples -> weightless
//     RMSNorm -> embedding_projection.
// Weights from either QAT format through the text model's linear kernels (Google's w4a16 files keep them bf16 on
// `ignore`; a packed one is read as int4), all rows of an image or clip in one batched call. F32 computes in f32;
// BF16 (and Int8, which runs them as BF16) rounds where transformers' bf16 model rounds: the inputs cast to bf16
// first, then after every op, LayerNorms and RMSNorm computed in f32.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/linear.h"
#include "model/gemma4.h"
#include "model/gemma4_multimodal_embedder.h"
#include "util/huge_buffer.h"

namespace qs {

class LoraAdapter;
class ThreadPool;

struct LayerNormWeights {
  std::vector<float> weight, bias;
};

class Gemma4UnifiedVisionEmbedder {
 public:
  // model.vision_embedder.* and model.embed_vision.embedding_projection of the checkpoint (the names on disk);
  // throws, naming the tensor, when one is missing or misshapen.
  static std::unique_ptr<Gemma4UnifiedVisionEmbedder> load(const Checkpoint& checkpoint, const ModelConfig& config,
                                                           Precision precision);
  const Gemma4UnifiedVisionConfig& config() const { return config_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  // pixel_values [patches, 3 x model_patch_size^2] and position_ids [patches, 2] (x, y on the merged grid) of one
  // image, without HF's padding rows; returns its soft tokens [patches, text hidden] (get_image_features' pooler
  // output). Throws when a position lies outside the table. With `lora`, the adapter's A and B for patch_dense and
  // embed_vision's projection join them, as PEFT's.
  std::vector<float> encode(std::span<const float> pixel_values, std::span<const int32_t> position_ids,
                            const LoraAdapter* lora = nullptr) const;

 private:
  Gemma4UnifiedVisionEmbedder() = default;
  void layer_norm(std::vector<float>& x, const LayerNormWeights& w) const;
  void round(std::span<float> x) const;

  Gemma4UnifiedVisionConfig config_;
  Precision precision_ = Precision::F32;
  ThreadPool* pool_ = nullptr;
  LayerNormWeights patch_ln1_, patch_ln2_, pos_norm_;
  LinearWeight patch_dense_;
  std::string patch_dense_module_;  // its module name in transformers, as a LoRA adapter names it
  std::vector<float> patch_dense_bias_;
  std::vector<float> pos_embedding_;  // [mm_posemb_size, 2, mm_embed_dim]: per position, its x row then its y row
  Gemma4MultimodalEmbedder multimodal_embedder_;
  std::vector<HugeBuffer> int4_storage_;
  uint64_t weight_bytes_ = 0;
};

class Gemma4UnifiedAudioEmbedder {
 public:
  // model.embed_audio.* of the checkpoint; throws, naming the tensor, when it is missing or misshapen.
  static std::unique_ptr<Gemma4UnifiedAudioEmbedder> load(const Checkpoint& checkpoint, const ModelConfig& config,
                                                          Precision precision);
  int64_t samples_per_token() const { return config_.audio_embed_dim; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  // frames [tokens, samples_per_token()] of 16 kHz samples; returns [tokens, text hidden]. With `lora`, the
  // adapter's A and B for embed_audio's projection join it, as PEFT's.
  std::vector<float> encode(std::span<const float> frames, const LoraAdapter* lora = nullptr) const;

 private:
  Gemma4UnifiedAudioEmbedder() = default;

  Gemma4UnifiedAudioConfig config_;
  Precision precision_ = Precision::F32;
  ThreadPool* pool_ = nullptr;
  Gemma4MultimodalEmbedder embedder_;
  std::vector<HugeBuffer> int4_storage_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace qs
