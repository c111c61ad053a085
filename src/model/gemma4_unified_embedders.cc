#include "model/gemma4_unified_embedders.h"

#include <fmt/format.h>

#include "kernels/ops.h"
#include "model/lora_adapter.h"
#include "model/weight_reader.h"
#include "util/error.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace {

// As Google's files (and transformers' save_pretrained) name them: the patch embedding and position table under
// model.vision_embedder, the final projection under model.embed_vision (transformers renames both on load).
const std::string kVision = "model.vision_embedder.";
const std::string kVisionProjection = "model.embed_vision.";
const std::string kAudio = "model.embed_audio.";
constexpr float kLayerNormEps = 1e-5f;  // nn.LayerNorm's default, which the embedder keeps

LayerNormWeights load_layer_norm(const WeightReader& r, const std::string& module, int64_t n) {
  return {r.vector(module + ".weight", {n}), r.vector(module + ".bias", {n})};
}

}  // namespace

std::unique_ptr<Gemma4UnifiedVisionEmbedder> Gemma4UnifiedVisionEmbedder::load(const Checkpoint& checkpoint,
                                                                              const ModelConfig& config,
                                                                              Precision precision) {
  if (!config.unified_vision)
    throw Error(fmt::format("{}: config.json has no gemma4_unified vision_config: the model reads no images",
                            checkpoint.dir().string()));
  auto e = std::unique_ptr<Gemma4UnifiedVisionEmbedder>(new Gemma4UnifiedVisionEmbedder());
  const Gemma4UnifiedVisionConfig& v = e->config_ = *config.unified_vision;
  e->precision_ = precision;
  e->pool_ = &ThreadPool::shared();
  Progress progress("load vision embedder", 0, false);
  WeightReader r(checkpoint, config, e->int4_storage_, *e->pool_, progress,
                 precision == Precision::F32 ? Activations::F32 : Activations::BF16);
  const int64_t P = v.patch_values(), E = v.mm_embed_dim;
  e->patch_ln1_ = load_layer_norm(r, kVision + "patch_ln1", P);
  e->patch_dense_ = r.linear(kVision + "patch_dense", E, P);
  e->patch_dense_bias_ = r.vector(kVision + "patch_dense.bias", {E});
  e->patch_ln2_ = load_layer_norm(r, kVision + "patch_ln2", E);
  e->pos_embedding_ = r.vector(kVision + "pos_embedding", {v.mm_posemb_size, 2, E});
  e->pos_norm_ = load_layer_norm(r, kVision + "pos_norm", E);
  e->multimodal_embedder_ = Gemma4MultimodalEmbedder::load(r, kVisionProjection, E,
                                                           config.text.hidden_size, v.rms_norm_eps);
  // A LoRA adapter names them as transformers' modules, not as the files do.
  e->patch_dense_module_ = tower_peft_module(config, kVision + "patch_dense");
  e->multimodal_embedder_.module = tower_peft_module(config, e->multimodal_embedder_.module);
  e->weight_bytes_ = r.bytes() + (2 * P + 6 * E + e->pos_embedding_.size()) * 2;
  return e;
}

void Gemma4UnifiedVisionEmbedder::round(std::span<float> x) const {
  if (precision_ != Precision::F32) round_to_bf16(x);
}

void Gemma4UnifiedVisionEmbedder::layer_norm(std::vector<float>& x, const LayerNormWeights& w) const {
  const int64_t n = static_cast<int64_t>(w.weight.size());
  qs::layer_norm(x.data(), static_cast<int64_t>(x.size()) / n, n, w.weight.data(), w.bias.data(), kLayerNormEps);
  round(x);
}

std::vector<float> Gemma4UnifiedVisionEmbedder::encode(std::span<const float> pixel_values,
                                                       std::span<const int32_t> position_ids,
                                                       const LoraAdapter* lora) const {
  const int64_t P = config_.patch_values(), E = config_.mm_embed_dim;
  const int64_t rows = static_cast<int64_t>(position_ids.size()) / 2;
  if (rows == 0 || static_cast<int64_t>(position_ids.size()) != rows * 2 ||
      static_cast<int64_t>(pixel_values.size()) != rows * P)
    throw Error(fmt::format("vision embedder: {} pixel values and {} position ids are not whole patches of {} values",
                            pixel_values.size(), position_ids.size(), P));
  for (int64_t t = 0; t < rows * 2; ++t)
    if (position_ids[t] < 0 || position_ids[t] >= config_.mm_posemb_size)
      throw Error(fmt::format("vision embedder: patch {} lies at {} {} on the merged grid; the position table "
                              "(mm_posemb_size) holds 0..{}",
                              t / 2, t % 2 ? "y" : "x", position_ids[t], config_.mm_posemb_size - 1));
  // Step 1: patch embedding, LayerNorm -> Linear (+ bias) -> LayerNorm, on the pixels cast to the weights' dtype.
  std::vector<float> x(pixel_values.begin(), pixel_values.end());
  round(x);
  layer_norm(x, patch_ln1_);
  std::vector<float> h(rows * E);
  linear_forward(patch_dense_, x.data(), rows, h.data(), *pool_,
                 precision_ == Precision::F32 ? Activations::F32 : Activations::BF16);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < E; ++i) h[t * E + i] += patch_dense_bias_[i];
  round(h);
  if (const LoraWeights* lw = lora ? lora->find_tower(patch_dense_module_) : nullptr)
    lw->add_to(x.data(), all_rows(rows), h.data(), precision_ != Precision::F32, *pool_);  // after the bias, as PEFT
  layer_norm(h, patch_ln2_);
  // Step 2: the factorized position embedding, the x table's row plus the y table's (a sum in the table's dtype),
  // added, then LayerNorm.
  std::vector<float> pos(E);
  for (int64_t t = 0; t < rows; ++t) {
    const float* px = &pos_embedding_[(position_ids[t * 2] * 2 + 0) * E];
    const float* py = &pos_embedding_[(position_ids[t * 2 + 1] * 2 + 1) * E];
    for (int64_t i = 0; i < E; ++i) pos[i] = px[i] + py[i];
    round(pos);
    for (int64_t i = 0; i < E; ++i) h[t * E + i] += pos[i];
  }
  round(h);
  layer_norm(h, pos_norm_);
  // Step 3: weightless RMSNorm and the projection to the text width.
  return multimodal_embedder_.embed(h, precision_, *pool_,
                                    lora ? lora->find_tower(multimodal_embedder_.module) : nullptr);
}

std::unique_ptr<Gemma4UnifiedAudioEmbedder> Gemma4UnifiedAudioEmbedder::load(const Checkpoint& checkpoint,
                                                                            const ModelConfig& config,
                                                                            Precision precision) {
  if (!config.unified_audio)
    throw Error(fmt::format("{}: config.json has no gemma4_unified audio_config: the model reads no audio",
                            checkpoint.dir().string()));
  auto e = std::unique_ptr<Gemma4UnifiedAudioEmbedder>(new Gemma4UnifiedAudioEmbedder());
  e->config_ = *config.unified_audio;
  e->precision_ = precision;
  e->pool_ = &ThreadPool::shared();
  Progress progress("load audio embedder", 0, false);
  WeightReader r(checkpoint, config, e->int4_storage_, *e->pool_, progress,
                 precision == Precision::F32 ? Activations::F32 : Activations::BF16);
  e->embedder_ = Gemma4MultimodalEmbedder::load(r, kAudio, e->config_.audio_embed_dim, config.text.hidden_size,
                                                e->config_.rms_norm_eps);
  e->weight_bytes_ = r.bytes();
  return e;
}

std::vector<float> Gemma4UnifiedAudioEmbedder::encode(std::span<const float> frames, const LoraAdapter* lora) const {
  const int64_t n = config_.audio_embed_dim;
  if (frames.empty() || static_cast<int64_t>(frames.size()) % n != 0)
    throw Error(fmt::format("audio embedder: {} samples are not whole frames of {}", frames.size(), n));
  std::vector<float> x(frames.begin(), frames.end());
  if (precision_ != Precision::F32) round_to_bf16(x);  // the waveform cast to the projection's dtype
  return embedder_.embed(x, precision_, *pool_, lora ? lora->find_tower(embedder_.module) : nullptr);
}

}  // namespace qs
