#pragma once
// Writing a checkpoint as a stream of generated tensors: each output tensor is produced row-block by
// row-block (in parallel, on every core) into a bounded buffer that is appended to the writer, so memory
// stays at a few buffers whatever the model size.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "formats/checkpoint_writer.h"
#include "util/progress.h"

namespace qs {

struct OutputTensor {
  TensorSpec spec;
  int64_t rows = 1;                // the unit of work: the first dimension (1 for scalars and vectors)
  uint64_t source_bytes = 0;       // what producing it reads, for progress
  // Writes rows [r0, r1) into out (their bytes only). Called concurrently on disjoint ranges.
  std::function<void(int64_t r0, int64_t r1, std::byte* out)> fill;
  std::function<void(int64_t r0, int64_t r1)> rows_written;  // optional: e.g. drop those source pages
  std::function<void()> done;      // optional: after the whole tensor is written
};

// Streams every tensor into `writer` in the order it expects; `tensors` must name exactly the writer's plan.
// Filling the next block overlaps writing the previous one.
void stream_tensors(CheckpointWriter& writer, std::vector<OutputTensor>& tensors, Progress& progress);

std::vector<TensorSpec> specs_of(const std::vector<OutputTensor>& tensors);

// An I64 [2] weight_shape tensor, a bf16 copy of a source range and similar one-liners.
OutputTensor constant_tensor(TensorSpec spec, std::vector<std::byte> bytes);

}  // namespace qs
