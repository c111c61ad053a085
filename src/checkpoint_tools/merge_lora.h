#pragma once
// `merge-lora BASE ADAPTER OUT`: a bf16 checkpoint whose adapted linears hold W + scale * B A, as PEFT's
// merge_and_unload writes them (peft/tuners/lora/layer.py Linear.merge: the delta B A * scale computed in f32 from
// the f32 adapter, added to the bf16 weight and rounded to bf16 once); every other tensor and side file is copied
// unchanged. LoRA on the MoE experts (target_parameters) merges into the fused experts.gate_up_proj / down_proj as
// ParamWrapper.merge does it: the f32 delta scale * B_e A_e cast to bf16, then added (lora_experts.h). The base must
// be the bf16 export: a merged weight is no longer on the QAT grid, so merging into int4
// would round every adapted weight to its group's 16 levels (`repack` refuses it as off grid; `verify` counts it).
#include <cstdint>
#include <filesystem>

namespace qs {

struct MergeLoraOptions {
  std::filesystem::path base, adapter, out;
  bool progress = true;
};

struct MergeLoraResult {
  int64_t merged = 0, tensors = 0;  // linears and expert parameters merged, tensors written
  uint64_t bytes = 0;
  double seconds = 0;
};

// Throws qs::Error naming the file, tensor or field at fault; writes nothing then.
MergeLoraResult merge_lora(const MergeLoraOptions& options);

}  // namespace qs
