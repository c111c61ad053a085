#pragma once
// Every tensor of the Gemma 4 text decoder, with its shape, as a bf16 QAT export (-qat-q4_0-unquantized)
// stores it. The synthetic generator writes this list, the repack and the inspector check checkpoints
// against it, and the model loader reads it: one description of the architecture for all of them.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
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
  // Towers only (model/gemma4_tower_tensors.h):
  ClipBound,          // a clipped linear's input_min / input_max / output_min / output_max scalar
  TowerParameter,     // position table, convolution kernels, biases, per-dim and standardization scales
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

// Stored tensors matched to the architecture as the loader reads them: by key, as part of a packed module
// (weight_packed / weight_scale / weight_shape), or under a layer's experts (fused, or one module per expert:
// matched to that layer's fused tensor). Anything else (towers, k/v of KV-shared layers, a redundant lm_head) the
// text model never reads.
class ArchTensorIndex {
 public:
  explicit ArchTensorIndex(const ModelConfig& config);
  ArchTensorIndex(const ArchTensorIndex&) = delete;  // holds pointers into its own list
  ArchTensorIndex& operator=(const ArchTensorIndex&) = delete;
  const ArchTensor* find(std::string_view stored_name) const;  // nullptr: never read

 private:
  std::vector<ArchTensor> arch_;
  std::map<std::string, const ArchTensor*, std::less<>> by_name_, by_module_, by_experts_prefix_;
};

// Per-expert module names in a compressed-tensors checkpoint: <layer>.experts.<e>.<gate_proj|up_proj|down_proj>.
std::string expert_module(const std::string& layer_prefix, int64_t expert, const std::string& proj);

}  // namespace qs
