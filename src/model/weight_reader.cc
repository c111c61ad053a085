#include "model/weight_reader.h"

#include <fmt/format.h>

#include <functional>
#include <numeric>

#include "quant/w4a16.h"
#include "util/error.h"
#include "util/progress.h"

namespace qs {

WeightReader::WeightReader(const Checkpoint& c, const ModelConfig& config, std::vector<HugeBuffer>& storage,
                           ThreadPool& pool, Progress& progress, Activations activations)
    : c_(c), storage_(storage), pool_(pool), progress_(progress), layout_(fastest_int4_layout(activations)) {
  if (config.quantization) {
    std::string why = config.quantization->unsupported_reason();
    if (!why.empty()) unsupported_ = why;
    group_ = config.quantization->group_size();
  }
}

const TensorRef& WeightReader::tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorRef* t = c_.find(name);
  if (!t) throw Error(fmt::format("{}: tensor '{}' (shape [{}]) is missing", c_.dir().string(), name, fmt::join(shape, ", ")));
  if (t->shape() != shape)
    throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", c_.dir().string(), name,
                            fmt::join(t->shape(), ", "), fmt::join(shape, ", ")));
  return *t;
}

std::vector<float> WeightReader::vector(const std::string& name, std::vector<int64_t> shape) const {
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

LinearWeight WeightReader::linear(const std::string& module, int64_t out, int64_t in) {
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

LinearWeight WeightReader::bf16_matrix(const std::string& name, const std::vector<int64_t>& shape, int64_t rows) {
  const TensorRef& t = tensor(name, shape);
  if (t.dtype() != DType::BF16) throw Error(fmt::format("{}: '{}' must be BF16", c_.dir().string(), name));
  bytes_ += t.nbytes();
  const int64_t values = std::reduce(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  return {rows, values / rows, WeightKind::BF16, t.bytes().data()};
}

bool WeightReader::tile(LinearWeight& w) {
  HugeBuffer storage;
  LinearWeight t = tiled(w, storage, pool_, layout_);
  if (!t.in_tiles()) return false;
  storage_.push_back(std::move(storage));
  w = t;
  return true;
}

}  // namespace qs
