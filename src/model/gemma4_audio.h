#pragma once
// The Gemma 4 audio tower (E2B/E4B) and its multimodal embedder: log-mel frames -> two subsampling convolutions
// (4x fewer frames) -> conformer layers (feed-forward, chunked local self-attention with relative positions, light
// convolution, feed-forward) -> output projection -> embed_audio, giving the soft tokens the text model takes at
// the audio placeholders. Names follow transformers' modeling_gemma4.py (Gemma4AudioModel,
// Gemma4MultimodalEmbedder, Gemma4Model.get_audio_features); the forward pass reads top to bottom in
// gemma4_audio.cc. Weights from either QAT format, per tensor as the file holds them (int4 or bf16), through the
// text model's linear kernels.
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/linear.h"
#include "model/clippable_linear.h"
#include "model/gemma4.h"
#include "util/huge_buffer.h"

namespace qs {

class LoraAdapter;
class ThreadPool;

struct Gemma4AudioFeedForward {
  std::vector<float> pre_layer_norm, post_layer_norm;
  ClippableLinear ffw_layer_1, ffw_layer_2;  // hidden -> 4 hidden -> hidden
};

struct Gemma4AudioAttention {
  ClippableLinear q_proj, k_proj, v_proj, post;
  ClippableLinear relative_k_proj;  // the sinusoidal relative-position embeddings' keys (a plain nn.Linear: no bounds)
  std::vector<float> per_dim_scale;  // [head_dim], through softplus
};

struct Gemma4AudioLightConv1d {
  std::vector<float> pre_layer_norm, conv_norm;
  ClippableLinear linear_start, linear_end;  // hidden -> 2 hidden (GLU) / hidden -> hidden
  std::vector<float> depthwise_conv1d;        // [hidden, kernel], causal
};

struct Gemma4AudioLayer {
  Gemma4AudioFeedForward feed_forward1, feed_forward2;
  Gemma4AudioAttention self_attn;
  Gemma4AudioLightConv1d lconv1d;
  std::vector<float> norm_pre_attn, norm_post_attn, norm_out;
};

// Gemma4AudioSubSampleConvProjectionLayer: 3x3 convolution of stride 2 (no bias), LayerNorm over channels, ReLU.
struct Gemma4AudioSubsampleLayer {
  LinearWeight conv;  // [out channels, in channels x 3 x 3], PyTorch's weight order
  std::vector<float> norm;
};

class Gemma4AudioEncoder {
 public:
  // Reads model.audio_tower.* and model.embed_audio.* (the config's audio_config); throws naming what is missing,
  // misshapen or of an unreadable dtype. bf16 weights are read in place from the checkpoint's memory map, so it must
  // outlive the encoder (e.g. the text model's checkpoint(), when both come from one directory).
  static std::unique_ptr<Gemma4AudioEncoder> load(const Checkpoint& checkpoint, const ModelConfig& config,
                                                  Precision precision);

  const Gemma4AudioConfig& config() const { return audio_; }
  int64_t text_hidden() const { return text_hidden_; }
  // Mel bins per frame the subsampling takes (the feature extractor's 128 for E2B/E4B).
  int64_t mel_bins() const { return audio_.subsampling_conv_channels[0] / 4 * 4; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  // Which soft tokens of a clip are real: each stands for 4 frames (two stride-2 subsamplings), valid when the
  // first of them is (transformers' output mask, frame_mask[::2][::2]). Padding ones are dropped.
  static std::vector<uint8_t> soft_token_mask(std::span<const uint8_t> frame_mask);

  // features [frames, mel_bins] (log-mel, frames = frame_mask.size()), frame_mask 1 for a real frame, 0 for
  // padding -> the valid soft tokens, [count of soft_token_mask's ones, text_hidden], in order. With `lora`, the
  // adapter's A and B for the tower's and embed_audio's linears (LoraAdapter::find_tower) join them, as PEFT's.
  std::vector<float> encode(std::span<const float> features, std::span<const uint8_t> frame_mask,
                            const LoraAdapter* lora = nullptr) const;

 private:
  struct Clip;  // one clip's activations
  void subsample(const Gemma4AudioSubsampleLayer& layer, Clip& a) const;
  void feed_forward(const Gemma4AudioFeedForward& f, std::vector<float>& h, Clip& a) const;
  void attention(const Gemma4AudioAttention& att, const std::vector<float>& x, std::vector<float>& out,
                 Clip& a) const;
  void light_conv(const Gemma4AudioLightConv1d& c, std::vector<float>& h, Clip& a) const;
  void relative_keys(const Gemma4AudioAttention& att, std::vector<float>& keys, const Clip& a) const;
  // y = clamp(W clamp(x) + the adapter's B A clamp(x)) for several clippable linears at once (one job), outputs
  // rounded as the model's are.
  void clipped(std::initializer_list<std::pair<const ClippableLinear*, std::vector<float>*>> wy,
               const std::vector<float>& x, int64_t rows, Clip& a) const;
  // y = W x (+ bias) + the adapter's B A x, for a linear without bounds.
  void linear(const ClippableLinear& w, const float* x, int64_t rows, std::vector<float>& y, const Clip& a,
              std::span<const float> bias = {}) const;
  void add_lora(const ClippableLinear& w, const float* x, int64_t rows, std::vector<float>& y, const Clip& a) const;
  void norm(std::vector<float>& x, const std::vector<float>& weight) const;  // RMSNorm of rows of weight.size()
  Activations activations() const;
  void clamp_gradient(std::vector<float>& x) const;
  void round(std::span<float> x) const;

  Gemma4AudioConfig audio_;
  int64_t text_hidden_ = 0;
  Precision precision_ = Precision::BF16;
  Gemma4AudioSubsampleLayer subsample_[2];
  ClippableLinear input_proj_linear_;
  std::vector<Gemma4AudioLayer> layers_;
  ClippableLinear output_proj_;
  std::vector<float> output_proj_bias_;
  ClippableLinear embedding_projection_;  // embed_audio: RMSNorm without scale, then this
  std::vector<HugeBuffer> int4_storage_;
  uint64_t weight_bytes_ = 0;
  ThreadPool* pool_ = nullptr;
};

}  // namespace qs
