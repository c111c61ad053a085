#pragma once
// W4A8, linear_forward's opt-in Int8 activations, for int4 weights in tiles or blocks (linear.h). The portable code
// here defines the arithmetic; linear_int8_avx512.cc computes the same bits with VNNI on the Blocks layout.
//
// Activations, per token and group of 32 columns: d = amax / 127, q = rint(x / d) clamped to +-127 (0 when the
// group is all zero). The weights' stored nibbles n = level + 8 are used as unsigned bytes, so a group's integer
// dot product is sum(n q) - 8 sum(q), exact in int32 whatever the order of its terms. Per (row, token) one f32
// accumulator takes the groups in order: fma(float(integer dot), bf16 scale x d, accumulator).
#include <cstdint>
#include <span>
#include <vector>

namespace qs {

class ThreadPool;
struct LinearJob;
struct LinearWeight;

namespace int8 {

// One token's group: 16 quantized even columns then 16 odd ones (the int4 nibble order: column 2k is q[k], 2k + 1
// is q[16 + k]), the integer dot product's start -8 sum(q), and the scale d.
struct alignas(64) Group {
  int8_t q[32];
  int32_t start;
  float scale;
  float unused[6];  // 64 bytes a group
};
static_assert(sizeof(Group) == 64);

void quantize(const float* x, int64_t in, int64_t T, Group* out);  // [T][in / 32]
bool takes(const LinearWeight& w);                                  // int4 in tiles or blocks
// Rows [r0, r1) (whole tiles or blocks) of y = W x for T tokens; rows_vnni reads the Blocks layout only.
void rows_portable(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1);
void rows_vnni(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1);
void quantize_avx512(const float* x, int64_t in, int64_t T, Group* out);
bool cpu_has_vnni();

// Jobs whose weights it takes (see takes), as one parallel pass.
void forward(std::span<const LinearJob> jobs, ThreadPool& pool, bool vnni);

}  // namespace int8
}  // namespace qs
