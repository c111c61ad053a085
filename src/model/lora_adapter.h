#pragma once
// A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) bound to one loaded Gemma4Model: for each
// adapted linear W, y = W x + scale * B (A x), computed beside W (the base weights, bf16 or int4, are never
// touched), as peft/tuners/lora/layer.py's Linear.forward does: A [r, in] and B [out, r] held in f32 (PEFT casts
// bf16/f16 adapter weights up to f32, autocast_adapter_dtype), the delta added to the base layer's output and the
// sum cast to the base's dtype. Adaptable: every linear of the text decoder (attention q/k/v/o, MLP gate/up/down,
// the MoE router's proj, the per-layer-embedding projections), and through PEFT's target_parameters the MoE
// experts' fused gate_up_proj and down_proj (model/lora_experts.h); the vision and audio towers' linears and
// embed_vision's / embed_audio's projections (Gemma4ForConditionalGeneration with towers: PEFT's all-linear reaches
// them); the LM head and the embeddings are refused by name.
#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/linear.h"
#include "model/lora_config.h"
#include "model/lora_experts.h"

namespace qs {

class Gemma4Model;
struct Gemma4Layer;
struct ModelConfig;
class ThreadPool;

inline constexpr int64_t kDefaultMaxLoraRank = 256;

struct LoraWeights {
  std::string module;  // the PEFT module name, for messages
  int64_t rank = 0, in = 0, out = 0;
  float scale = 1;
  // A [rank, in] as stored; B transposed to [rank, out] (B's column k is row k), so that B (A x) is rank passes
  // of y += (A x)_k * B[:, k] over contiguous rows.
  std::vector<float> a, bt;
  float b(int64_t o, int64_t k) const { return bt[k * out + o]; }  // B [out, rank] as PEFT stores it

  // y[row] += scale * B (A x[row]) for each listed row of x [*, in] and y [*, out]; with round_bf16, each sum is
  // rounded to bf16 as PEFT's bf16 model casts it back. add_low_rank (lora_experts.h): split over the pool so that
  // one decoded row uses every core; a row's sums never depend on the other rows.
  void add_to(const float* x, std::span<const int64_t> rows, float* y, bool round_bf16, ThreadPool& pool) const;
};

// A tower linear's checkpoint name (without .weight) from its module name in transformers, which PEFT's adapters use,
// and back. They differ on the 12B (gemma4_unified), whose embedders transformers renames on load
// (model.embed_vision.patch_dense is model.vision_embedder.patch_dense on disk); "" for a name only the files use.
std::string tower_checkpoint_module(const ModelConfig& config, const std::string& peft_module);
std::string tower_peft_module(const ModelConfig& config, const std::string& checkpoint_module);

// Rows 0 .. n - 1: a whole call's rows through LoraWeights::add_to.
std::vector<int64_t> all_rows(int64_t n);

class LoraAdapter {
 public:
  // Reads DIR and checks it against `base`: every tensor names an adapted linear of the base with A [r, in] and
  // B [out, r] for that linear's in/out and the rank adapter_config.json gives it, or a targeted expert parameter
  // with A [experts * r, in] and B [out, r * experts], r <= max_rank; every targeted linear and expert parameter
  // has both. Throws qs::Error naming the file, field or tensor at fault.
  static std::shared_ptr<const LoraAdapter> load(const std::filesystem::path& dir, const Gemma4Model& base,
                                                 std::string name, int64_t max_rank = kDefaultMaxLoraRank);

  const std::string& name() const { return name_; }
  // A hash of its files' bytes (never 0): the prefix cache's salt for sequences using it, so that K/V computed
  // under one adapter is only ever reused under the same adapter, in this process or (from disk) after a restart.
  uint64_t id() const { return id_; }
  const std::filesystem::path& dir() const { return dir_; }
  const LoraConfig& config() const { return config_; }
  int64_t max_rank() const { return max_rank_; }  // the largest rank of its linears and expert parameters
  uint64_t bytes() const;                          // A and B as held (f32)
  // Its A/B for the base linear `w`, or nullptr when the adapter leaves it alone.
  const LoraWeights* find(const LinearWeight* w) const;
  const std::unordered_map<const LinearWeight*, LoraWeights>& weights() const { return weights_; }
  // Its A/B for a tower linear, by the module name PEFT gives it (e.g.
  // "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear", "model.audio_tower.output_proj",
  // "model.embed_vision.embedding_projection"), or nullptr. A tower reads them while it encodes an image or a clip
  // for a sequence using the adapter.
  const LoraWeights* find_tower(const std::string& module) const;
  bool adapts_towers() const { return !tower_weights_.empty(); }
  const std::unordered_map<std::string, LoraWeights>& tower_weights() const { return tower_weights_; }
  // Its A/B for one expert parameter of the base layer `layer`, or nullptr when the adapter leaves it alone.
  const ExpertLoraWeights* find_experts(const Gemma4Layer* layer, ExpertParam param) const;
  int64_t expert_parameters() const;  // how many expert parameters it adapts (layers x gate_up/down)

 private:
  std::string name_;
  uint64_t id_ = 0;
  std::filesystem::path dir_;
  LoraConfig config_;
  int64_t max_rank_ = 0;
  std::unordered_map<const LinearWeight*, LoraWeights> weights_;
  std::unordered_map<std::string, LoraWeights> tower_weights_;  // by PEFT module name
  std::unordered_map<const Gemma4Layer*, std::array<ExpertLoraWeights, 2>> experts_;  // by ExpertParam
};

// The base linears an adapter may target, with the module names transformers gives them in the loaded class
// (`prefix` "model.language_model." for Gemma4ForConditionalGeneration, "model." for Gemma4ForCausalLM).
struct AdaptableLinear {
  std::string module;
  const LinearWeight* weight;
};
std::vector<AdaptableLinear> adaptable_linears(const Gemma4Model& model, const std::string& prefix);

}  // namespace qs
