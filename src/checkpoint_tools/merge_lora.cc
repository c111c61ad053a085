#include "checkpoint_tools/merge_lora.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <map>

#include "checkpoint_tools/tensor_stream.h"
#include "formats/dtype.h"
#include "model/gemma4.h"
#include "model/lora_adapter.h"
#include "util/error.h"
#include "util/progress.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

// The bf16 weight [out, in] with the adapter's delta added, row block by row block.
OutputTensor merged_tensor(const TensorRef& src, const LoraWeights& lw) {
  OutputTensor t{{src.name(), DType::BF16, src.shape()}, lw.out, src.nbytes()};
  t.source = src.bytes();
  t.fill = [src, &lw](int64_t r0, int64_t r1, std::byte* out) {
    const std::byte* w = src.bytes().data();
    for (int64_t o = r0; o < r1; ++o)
      for (int64_t c = 0; c < lw.in; ++c) {
        float delta = 0;
        for (int64_t k = 0; k < lw.rank; ++k) delta += lw.b(o, k) * lw.a[k * lw.in + c];
        const float sum = bf16_to_f32(load_unaligned<uint16_t>(w + (o * lw.in + c) * 2)) + delta * lw.scale;
        const uint16_t bits = f32_to_bf16(sum);
        std::memcpy(out + ((o - r0) * lw.in + c) * 2, &bits, 2);
      }
  };
  return t;
}

// The bf16 fused expert weights [E, out, in] with the adapter's delta added, as PEFT's ParamWrapper.merge does it:
// delta_e = scale * B_e A_e in f32 (get_delta_weight), cast to the weight's dtype (bf16), then added to the bf16
// weight and rounded again: bf16(W + bf16(scale * B_e A_e)). Rows are (expert, out) pairs.
OutputTensor merged_experts(const TensorRef& src, const ExpertLoraWeights& ew) {
  OutputTensor t{{src.name(), DType::BF16, src.shape()}, ew.experts * ew.out, src.nbytes()};
  t.source = src.bytes();
  t.fill = [src, &ew](int64_t r0, int64_t r1, std::byte* out) {
    const std::byte* w = src.bytes().data();
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t e = row / ew.out, o = row % ew.out;
      const float* a = ew.a_of(e);
      const float* bt = ew.bt_of(e);
      for (int64_t c = 0; c < ew.in; ++c) {
        float delta = 0;
        for (int64_t k = 0; k < ew.rank; ++k) delta += bt[k * ew.out + o] * a[k * ew.in + c];
        const float sum = bf16_to_f32(load_unaligned<uint16_t>(w + (row * ew.in + c) * 2)) +
                          round_to_bf16(delta * ew.scale);
        const uint16_t bits = f32_to_bf16(sum);
        std::memcpy(out + ((row - r0) * ew.in + c) * 2, &bits, 2);
      }
    }
  };
  return t;
}

bool replaced_side_file(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.ends_with(".safetensors") || n == "model.safetensors.index.json";
}

}  // namespace

MergeLoraResult merge_lora(const MergeLoraOptions& o) {
  Progress timer("merge-lora", 0, false);
  if (fs::exists(o.out)) throw Error(fmt::format("{}: already exists; nothing was written", o.out.string()));
  const auto model = Gemma4Model::load(o.base, Precision::F32);
  if (model->int4_weights())
    throw Error(fmt::format("{}: int4 weights; merge-lora writes a bf16 checkpoint from the bf16 export of the same "
                            "QAT weights (a merged weight leaves the QAT grid)", o.base.string()));
  const auto adapter = LoraAdapter::load(o.adapter, *model, o.adapter.filename().string(), INT64_MAX);
  const std::string prefix = model->config().text_prefix();
  std::map<std::string, const LoraWeights*> merged;  // checkpoint tensor name -> its adapter weights
  for (const AdaptableLinear& l : adaptable_linears(*model, prefix))
    if (const LoraWeights* lw = adapter->find(l.weight)) merged[l.module + ".weight"] = lw;
  for (const auto& [module, lw] : adapter->tower_weights())
    merged[tower_checkpoint_module(model->config(), module) + ".weight"] = &lw;
  std::map<std::string, const ExpertLoraWeights*> merged_experts_of;  // the fused tensors, by their names
  for (size_t l = 0; l < model->layers().size(); ++l)
    for (ExpertParam p : {ExpertParam::GateUp, ExpertParam::Down})
      if (const ExpertLoraWeights* ew = adapter->find_experts(&model->layers()[l], p))
        merged_experts_of[ew->parameter] = ew;

  MergeLoraResult result;
  std::vector<OutputTensor> outputs;
  for (const TensorRef& t : model->checkpoint().tensors()) {
    auto it = merged.find(t.name());
    auto experts = merged_experts_of.find(t.name());
    if (experts != merged_experts_of.end()) {
      if (t.dtype() != DType::BF16 || t.shape() != std::vector{experts->second->experts, experts->second->out,
                                                                 experts->second->in})
        throw Error(fmt::format("{}: tensor {} is not the fused bf16 experts weight merge-lora expects",
                                o.base.string(), t.name()));
      outputs.push_back(merged_experts(t, *experts->second));
      merged_experts_of.erase(experts);
    } else {
      outputs.push_back(it == merged.end() ? copied_tensor(t) : merged_tensor(t, *it->second));
    }
    result.bytes += t.nbytes();
  }
  if (!merged_experts_of.empty())  // a base whose experts are stored one module per expert
    throw Error(fmt::format("{}: holds no fused tensor {} to merge the adapter's experts into (merge-lora merges "
                            "LoRA on the experts into the fused experts.gate_up_proj / experts.down_proj of a bf16 "
                            "export)", o.base.string(), merged_experts_of.begin()->first));
  result.merged = static_cast<int64_t>(merged.size() + adapter->expert_parameters());
  result.tensors = static_cast<int64_t>(outputs.size());
  CheckpointWriter writer(o.out, specs_of(outputs));
  Progress progress("merge-lora " + o.adapter.filename().string(), result.bytes, o.progress);
  stream_tensors(writer, outputs, progress);
  for (const auto& e : fs::directory_iterator(model->checkpoint().dir()))
    if (e.is_regular_file() && !replaced_side_file(e.path())) writer.copy_file(e.path(), e.path().filename().string());
  writer.commit();
  progress.finish();
  result.seconds = timer.elapsed_seconds();
  return result;
}

}  // namespace qs
