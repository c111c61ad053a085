#pragma once
// Every tensor of the Gemma 4 text decoder, with its shape, as a bf16 QAT export (-qat-q4_0-unquantized)
// stores it. The synthetic generator writes this list, the repack and the inspector check checkpoints
// against it, and the model loader reads it: one description of the architecture for all of them.
#include <cstdint>
#include <string>
#include <vector>

#include "formats/model_config.h"

namespace qs {

enum class TensorRole {
  Embedding,          // embed_tokens (also the tied LM head)
  PerLayerEmbedding,  // embed_tokens_per_layer
  Linear,             // nn.Linear weight [out, in]
  RouterLinear,       // MoE router projection: a Linear the QAT export keeps in bf16
  FusedExperts,       // experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I]
  Norm,
  LayerScalar,
  RouterVector,       // router.scale, router.per_expert_scale
};

struct ArchTensor {
  std::string name;    // checkpoint key
  std::string module;  // key without ".weight" (for Linear roles)
  std::vector<int64_t> shape;
  TensorRole role;
  int64_t layer = -1;  // -1 for model-level tensors
  // A linear the w4a16 export packs: attention, dense MLP, per-layer-embedding projections, experts.
  bool quantized_in_w4a16 = false;
  // vLLM loads these modules fused (q/k/v, gate/up, one layer's experts): all must share one scheme.
  std::string fused_group;
};

std::vector<ArchTensor> gemma4_text_tensors(const ModelConfig& config);

// Tensors a checkpoint may carry beyond the list, which loaders ignore: k/v projections and k_norm of
// KV-shared layers (community re-exports keep them) and a redundant lm_head.weight.
std::vector<std::string> gemma4_tolerated_extras(const ModelConfig& config);

// Per-expert module names in a compressed-tensors checkpoint: <layer>.experts.<e>.<gate_proj|up_proj|down_proj>.
std::string expert_module(const std::string& layer_prefix, int64_t expert, const std::string& proj);

}  // namespace qs
