#pragma once
// Gemma4MultimodalEmbedder (transformers' modeling_gemma4.py): a tower's output rows to the text model's hidden
// space, RMSNorm without weight, then embedding_projection. The same for the vision and the audio tower.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "model/gemma4.h"

namespace qs {

class ThreadPool;
class WeightReader;

struct LoraWeights;

struct Gemma4MultimodalEmbedder {
  LinearWeight embedding_projection;  // [text hidden, tower width]
  std::string module;                 // "model.embed_vision.embedding_projection": a LoRA adapter's name for it
  float eps = 1e-6f;

  // <prefix>embedding_projection of a tower `width` wide (output_proj_dims or hidden_size) to `text_hidden`.
  static Gemma4MultimodalEmbedder load(WeightReader& r, const std::string& prefix, int64_t width, int64_t text_hidden,
                                       double eps);
  // x: [rows, width], normalized in place; returns [rows, text hidden]. BF16 (and Int8) round as a bf16 model does.
  // With `lora`, the projection's output gets its low-rank product as PEFT adds it.
  std::vector<float> embed(std::vector<float>& x, Precision precision, ThreadPool& pool,
                           const LoraWeights* lora = nullptr) const;
};

}  // namespace qs
