#pragma once
// Linear layers over weights as the checkpoint stores them, read in place from the memory map: bf16 [out, in],
// or W4A16 int4 (packed levels [out, in/8], bf16 scales [out, in/group]). Activations are f32 rows;
// accumulation is f32. An int4 weight is dequantized to bf16(level x scale), the value the bf16 QAT export
// stores, so both formats of one model compute the same products.
#include <cstddef>
#include <cstdint>

namespace qs {

class ThreadPool;

enum class WeightKind { BF16, Int4 };

struct LinearWeight {
  int64_t out = 0, in = 0;
  WeightKind kind = WeightKind::BF16;
  const std::byte* values = nullptr;  // bf16 [out, in], or int4 words [out, in/8]
  const std::byte* scales = nullptr;  // bf16 [out, in/group] for Int4
  int64_t group = 32;

  uint64_t bytes() const;                     // weight bytes read per use
  void dequantize_row(int64_t row, float* out_row) const;
  LinearWeight rows(int64_t first, int64_t count) const;  // a slice of output rows (e.g. one expert's gate)
};

// F32: activations used as f32 (the parity reference). BF16: activations rounded to bf16 first, as in a bf16
// model (W4A16's 16-bit activations); bf16 x bf16 products are exact in f32. Both accumulate in f32.
enum class Activations { F32, BF16 };

// y[t, o] = sum_i x[t, i] * W[o, i] for t < T (row strides: in for x, out for y).
void linear_forward(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool,
                    Activations activations = Activations::F32);

}  // namespace qs
