#pragma once
// PEFT LoRA on the fused MoE expert weights of Gemma 4 (LoraConfig.target_parameters, e.g. ["experts.gate_up_proj",
// "experts.down_proj"]), read as PEFT 0.21.2 writes and computes it (peft/tuners/lora/layer.py, ParamWrapper).
//
// transformers' Gemma4TextExperts holds gate_up_proj [E, 2I, H] and down_proj [E, H, I], each expert's slice an
// nn.Linear weight [out, in] (not transposed: `is_transposed` False), gate and up the first and second I rows of
// gate_up. ParamWrapper reads a 3-D parameter as (E, in, out) and, being not transposed, swaps them back to in = the
// last dimension, out = the middle one. It saves
//   lora_A [E * r, in]   expert-major: row e * r + k is the k-th row of expert e's A_e [r, in],
//   lora_B [out, r * E]  rank-major:   column k * E + e is the k-th column of expert e's B_e [out, r],
// (get_delta_factors: A.reshape(E, r, in); B.reshape(out, r, E).permute(2, 0, 1)), and adds scale * B_e A_e to
// the weight of every expert e (a _LoraFactorsProxy parametrization, torch.baddbmm(W, B, A, alpha=scale), in W's
// dtype), with scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), rank_pattern and alpha_pattern
// matched on the parameter's full name ("model.language_model.layers.0.experts.gate_up_proj"). qatserve leaves
// the weights alone and adds the same product to the activations instead, for the rows routed to e:
// y = W_e x + scale * B_e (A_e x), A and B in f32, which equals x (W_e + scale B_e A_e)^T up to f32 rounding. With
// bf16 activations A and B are rounded to bf16 (PEFT's bf16 model casts them to the weight's dtype) and the sum is
// rounded once; PEFT's bf16 model also rounds W_e + scale B_e A_e to bf16, which this cannot do without a copy of
// the weights (docs/lora.md: what that costs in agreement).
//
// Tensor names: PEFT wraps each targeted parameter of a module in its own ParamWrapper, nesting them in the order
// the module declares its parameters (gate_up_proj, then down_proj), the last targeted one outermost. Its tensors
// are "<layer>.experts.lora_A.weight"; each one further in adds ".base_layer": with both targeted, gate_up_proj's
// are "<layer>.experts.base_layer.lora_A.weight" and down_proj's "<layer>.experts.lora_A.weight".
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qs {

class Gemma4Model;
class ThreadPool;
struct LoraConfig;

enum class ExpertParam { GateUp = 0, Down = 1 };
inline constexpr std::array<const char*, 2> kExpertParamNames = {"gate_up_proj", "down_proj"};

// One targeted expert parameter of one layer: every expert's A_e [rank, in] and B_e transposed [rank, out].
struct ExpertLoraWeights {
  std::string parameter;  // its full name, for messages
  int64_t experts = 0, rank = 0, in = 0, out = 0;
  float scale = 1;
  std::vector<float> a;   // [experts, rank, in]: PEFT's lora_A as stored
  std::vector<float> bt;  // [experts, rank, out]
  bool present() const { return rank > 0; }
  const float* a_of(int64_t e) const { return a.data() + e * rank * in; }
  const float* bt_of(int64_t e) const { return bt.data() + e * rank * out; }
  // Fills a and bt from PEFT's lora_A [E * r, in] and lora_B [out, r * E] (shapes already checked).
  void set_a(std::vector<float> lora_a) { a = std::move(lora_a); }
  void set_b(const std::vector<float>& lora_b);
};

// An expert parameter an adapter targets: layer, which of the two, its full name, and the module name PEFT saves its
// lora_A / lora_B under ("<prefix>layers.<l>.experts" with ".base_layer" per wrapper outside it).
struct ExpertTarget {
  int64_t layer = 0;
  ExpertParam param = ExpertParam::GateUp;
  std::string parameter, module;
};
// The expert parameters `c.target_parameters` names on `model`'s text decoder (module names under `prefix`, as
// adaptable_linears), layer by layer. Throws naming an entry that matches no expert parameter of the base (LoRA on
// other parameters, or a base without experts).
std::vector<ExpertTarget> expert_targets(const LoraConfig& c, const Gemma4Model& model, const std::string& prefix);

// One row to adapt: its index in x and y, the low-rank factors it uses (its expert's, under its sequence's adapter).
struct LowRankRow {
  int64_t row;
  const float* a;   // [rank, in]
  const float* bt;  // [rank, out]
  int64_t rank;
  float scale;
};
// A block of output columns [first, first + count) written to y (row r at y + r * stride).
struct LowRankOutput {
  int64_t first, count;
  float* y;
  int64_t stride;
};

// y[row] += scale * B (A x[row]) for each listed row of x [*, in], B's out columns split over `outputs`; with
// round_bf16 each sum is rounded to bf16. A x is split over the pool by (row, k), B (A x) by (row, block of
// outputs); a row's sums never depend on the other rows (the same products, added in order k = 0, 1, ...).
void add_low_rank(std::span<const LowRankRow> rows, const float* x, int64_t in, int64_t out,
                  std::span<const LowRankOutput> outputs, bool round_bf16, ThreadPool& pool);

}  // namespace qs
