#pragma once
// Writing a checkpoint as a stream of generated tensors, reading, computing and writing at once: each output tensor
// is produced block by block of rows (in parallel, on every core) into one of a few bounded buffers that a writer
// thread appends to the checkpoint while the next blocks are computed, and the source of the blocks ahead is read
// in the background. Tensors copied unchanged go from the source's memory map straight to the writer. Memory
// stays at those few buffers whatever the model size.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/checkpoint_writer.h"
#include "util/progress.h"

namespace qs {

struct OutputTensor {
  TensorSpec spec;
  int64_t rows = 1;                // the unit of work: the first dimension (1 for scalars and vectors)
  uint64_t source_bytes = 0;       // what producing it reads, for progress
  // What producing rows [r0, r1) reads, in proportion: row r reads source[r * source.size() / rows, ...). Read
  // ahead in the background; may be empty.
  std::span<const std::byte> source;
  // The bytes are the source's, unchanged: written straight from it (no fill).
  bool copy_source = false;
  // Writes rows [r0, r1) into out (their bytes only). Called concurrently on disjoint ranges.
  std::function<void(int64_t r0, int64_t r1, std::byte* out)> fill;
  // Optional, after rows [r0, r1) are written (on the writer thread): e.g. drop those source pages.
  std::function<void(int64_t r0, int64_t r1)> rows_written;
  std::function<void()> done;      // optional: after the whole tensor is filled
};

// Streams every tensor into `writer` in the order it expects; `tensors` must name exactly the writer's plan.
void stream_tensors(CheckpointWriter& writer, std::vector<OutputTensor>& tensors, Progress& progress);

std::vector<TensorSpec> specs_of(const std::vector<OutputTensor>& tensors);

// A source tensor written unchanged, its pages dropped once written.
OutputTensor copied_tensor(const TensorRef& src);

// An I64 [2] weight_shape tensor, a bf16 copy of a source range and similar one-liners.
OutputTensor constant_tensor(TensorSpec spec, std::vector<std::byte> bytes);

}  // namespace qs
