#pragma once
// Reads a model's weights from a checkpoint, each as the file holds it: int4 weight_packed / weight_scale (copied
// into the kernels' tiles) or bf16 weight, checked against the shape the config implies; what is missing or
// misshapen is named. Shared by the text decoder and the towers (their linears are just more linears).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/linear.h"
#include "model/gemma4.h"
#include "model/gemma4_tensors.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/huge_buffer.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {

class WeightReader {
 public:
  WeightReader(const Checkpoint& c, const ModelConfig& config, std::vector<HugeBuffer>& storage,
               ThreadPool& pool, Progress& progress)
      : c_(c), config_(config), storage_(storage), pool_(pool), progress_(progress) {
    if (config.quantization) {
      std::string why = config.quantization->unsupported_reason();
      if (!why.empty()) unsupported_ = why;
      group_ = config.quantization->group_size();
    }
  }

  const TensorRef& tensor(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorRef* t = c_.find(name);
    if (!t) throw Error(fmt::format("{}: tensor '{}' (shape [{}]) is missing", c_.dir().string(), name, fmt::join(shape, ", ")));
    if (t->shape() != shape)
      throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", c_.dir().string(), name,
                              fmt::join(t->shape(), ", "), fmt::join(shape, ", ")));
    return *t;
  }

  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const {
    const TensorRef& t = tensor(name, shape);
    std::vector<float> out(t.nbytes() / dtype_size(t.dtype()));
    const std::byte* p = t.bytes().data();
    for (size_t i = 0; i < out.size(); ++i) {
      switch (t.dtype()) {
        case DType::BF16: out[i] = bf16_to_f32(load_unaligned<uint16_t>(p + 2 * i)); break;
        case DType::F32: out[i] = load_unaligned<float>(p + 4 * i); break;
        default:
          throw Error(fmt::format("{}: tensor '{}' is {}; expected BF16 or F32", c_.dir().string(), name,
                                  dtype_name(t.dtype())));
      }
    }
    return out;
  }

  LinearWeight linear(const std::string& module, int64_t out, int64_t in) {
    LinearWeight w{out, in};
    if (const TensorRef* packed = c_.find(module + ".weight_packed")) {
      if (!unsupported_.empty())
        throw Error(fmt::format("{}: layer '{}' is quantized with an unsupported scheme: {}", c_.dir().string(),
                                module, unsupported_));
      if (group_ <= 0 || in % group_ != 0)
        throw Error(fmt::format("{}: layer '{}' has {} input columns, not a multiple of the group size {}",
                                c_.dir().string(), module, in, group_));
      if (packed->dtype() != DType::I32) throw Error(fmt::format("{}: '{}.weight_packed' must be I32", c_.dir().string(), module));
      tensor(module + ".weight_packed", {out, in / kLevelsPerWord});
      const TensorRef& scale = tensor(module + ".weight_scale", {out, in / group_});
      if (scale.dtype() != DType::BF16)
        throw Error(fmt::format("{}: '{}.weight_scale' is {}; qatserve reads bf16 scales", c_.dir().string(), module,
                                dtype_name(scale.dtype())));
      if (const TensorRef* shape = c_.find(module + ".weight_shape"))
        if (shape->nbytes() != 16 || load_unaligned<int64_t>(shape->bytes().data()) != out ||
            load_unaligned<int64_t>(shape->bytes().data() + 8) != in)
          throw Error(fmt::format("{}: '{}.weight_shape' does not hold [{}, {}]", c_.dir().string(), module, out, in));
      w.kind = WeightKind::Int4;
      w.values = packed->bytes().data();
      w.scales = scale.bytes().data();
      w.group = group_;
      int4_ = true;
      if (tile(w)) packed->release(), scale.release();
      progress_.advance(w.bytes());
    } else {
      const TensorRef& t = tensor(module + ".weight", {out, in});
      if (t.dtype() != DType::BF16)
        throw Error(fmt::format("{}: '{}.weight' is {}; qatserve reads bf16 or int4 weights", c_.dir().string(),
                                module, dtype_name(t.dtype())));
      w.values = t.bytes().data();
    }
    bytes_ += w.bytes();
    return w;
  }

  // Fused experts [E, 2I, H] / [E, H, I] (bf16 export) or experts.{e}.{gate,up,down}_proj modules.
  std::vector<ExpertWeights> experts(const std::string& p, int64_t E, int64_t I, int64_t H) {
    std::vector<ExpertWeights> out(E);
    if (c_.find(p + "experts.gate_up_proj")) {
      LinearWeight gate_up = fused(p + "experts.gate_up_proj", {E, 2 * I, H});
      LinearWeight down = fused(p + "experts.down_proj", {E, H, I});
      for (int64_t e = 0; e < E; ++e)
        out[e] = {gate_up.rows(e * 2 * I, I), gate_up.rows(e * 2 * I + I, I), down.rows(e * H, H)};
      return out;
    }
    for (int64_t e = 0; e < E; ++e)
      out[e] = {linear(expert_module(p, e, "gate_proj"), I, H), linear(expert_module(p, e, "up_proj"), I, H),
                linear(expert_module(p, e, "down_proj"), H, I)};
    return out;
  }

  bool int4() const { return int4_; }
  uint64_t bytes() const { return bytes_; }

  // Copies an int4 weight into the kernels' streaming layout; false when it stays where it is.
  bool tile(LinearWeight& w) {
    HugeBuffer storage;
    LinearWeight t = tiled(w, storage, pool_);
    if (t.layout != Int4Layout::Tiles) return false;
    storage_.push_back(std::move(storage));
    w = t;
    return true;
  }

 private:
  LinearWeight fused(const std::string& name, std::vector<int64_t> shape) {
    const TensorRef& t = tensor(name, shape);
    if (t.dtype() != DType::BF16) throw Error(fmt::format("{}: '{}' must be BF16", c_.dir().string(), name));
    bytes_ += t.nbytes();
    return {shape[0] * shape[1], shape[2], WeightKind::BF16, t.bytes().data()};
  }

  const Checkpoint& c_;
  const ModelConfig& config_;
  std::vector<HugeBuffer>& storage_;
  ThreadPool& pool_;
  Progress& progress_;
  std::string unsupported_;
  int64_t group_ = 0;
  bool int4_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace qs
