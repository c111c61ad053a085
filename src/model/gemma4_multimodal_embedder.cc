#include "model/gemma4_multimodal_embedder.h"

#include "kernels/ops.h"
#include "model/lora_adapter.h"
#include "model/weight_reader.h"

namespace qs {

Gemma4MultimodalEmbedder Gemma4MultimodalEmbedder::load(WeightReader& r, const std::string& prefix, int64_t width,
                                                        int64_t text_hidden, double eps) {
  return {r.linear(prefix + "embedding_projection", text_hidden, width), prefix + "embedding_projection",
          static_cast<float>(eps)};
}

std::vector<float> Gemma4MultimodalEmbedder::embed(std::vector<float>& x, Precision precision, ThreadPool& pool,
                                                   const LoraWeights* lora) const {
  const bool bf16 = precision != Precision::F32;
  const int64_t width = embedding_projection.in, rows = static_cast<int64_t>(x.size()) / width;
  rms_norm(x.data(), rows, width, nullptr, eps);
  if (bf16) round_to_bf16(x);
  std::vector<float> y(rows * embedding_projection.out);
  linear_forward(embedding_projection, x.data(), rows, y.data(), pool, bf16 ? Activations::BF16 : Activations::F32);
  if (bf16) round_to_bf16(y);
  if (lora) lora->add_to(x.data(), all_rows(rows), y.data(), bf16, pool);
  return y;
}

}  // namespace qs
