#pragma once
// Reading model weights from a checkpoint in either QAT format, per tensor as the file holds it: a Linear as int4
// (weight_packed / weight_scale, copied into the kernels' streaming layout) or bf16, vectors (norms, scales) as
// f32. Every tensor is checked against the shape the config implies; what is missing or misshapen is named.
// The text decoder and the towers read their weights through it.
#include <cstdint>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/linear.h"
#include "util/huge_buffer.h"

namespace qs {

class Progress;
class ThreadPool;

class WeightReader {
 public:
  // `activations`: what the model's linears will take, which sets the int4 layout (fastest_int4_layout).
  WeightReader(const Checkpoint& c, const ModelConfig& config, std::vector<HugeBuffer>& storage, ThreadPool& pool,
               Progress& progress, Activations activations);

  bool tensor_present(const std::string& name) const { return c_.find(name) != nullptr; }
  const TensorRef& tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // A bf16 or f32 tensor of this shape as f32 values (shape {} for a scalar).
  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const;
  // The Linear `module` [out, in]: int4 when the file holds module.weight_packed, else bf16 module.weight.
  LinearWeight linear(const std::string& module, int64_t out, int64_t in);
  // A bf16 tensor of this shape read in place as a matrix of `rows` rows (fused experts, convolution kernels).
  LinearWeight bf16_matrix(const std::string& name, const std::vector<int64_t>& shape, int64_t rows);
  bool int4() const { return int4_; }
  uint64_t bytes() const { return bytes_; }

  // Copies an int4 weight into the kernels' streaming layout; false when it stays where it is.
  bool tile(LinearWeight& w);

 private:
  const Checkpoint& c_;
  std::vector<HugeBuffer>& storage_;
  ThreadPool& pool_;
  Progress& progress_;
  Int4Layout layout_;
  std::string unsupported_;
  int64_t group_ = 0;
  bool int4_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace qs
