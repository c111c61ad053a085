#pragma once
// W4A8, linear_forward's opt-in Int8 activations, for int4 weights in tiles (linear.h). The portable code here
// defines the arithmetic; linear_int8_avx512.cc computes the same bits with VNNI.
//
// Activations, per token and group of 32 columns: d = amax / 127, q = rint(x / d) clamped to +-127 (0 when the
// group is all zero). The weights' stored nibbles n = level + 8 are used as unsigned bytes, so a group's integer
// dot product sum(n q) is corrected by 8 sum(q). Per (row, token) four f32 partials, partial j taking group g's
// columns 8j..8j+7 as fma(float(integer part), bf16 scale x d, partial), groups in order, summed at the end as
// (p0 + p1) + (p2 + p3).
#include <cstdint>
#include <span>
#include <vector>

namespace qs {

class ThreadPool;
struct LinearJob;
struct LinearWeight;

namespace int8 {

// One token's group: 16 quantized even columns then 16 odd ones (the int4 nibble order), the four corrections
// 8 x sum(q) over columns 8j..8j+7, and the scale d.
struct alignas(64) Group {
  int8_t q[32];
  int32_t correction[4];
  float scale;
  float unused[3];  // 64 bytes a group
};
static_assert(sizeof(Group) == 64);

void quantize(const float* x, int64_t in, int64_t T, Group* out);  // [T][in / 32]
bool takes(const LinearWeight& w);                                  // int4 in tiles
// Rows [r0, r1) (whole tiles) of y = W x for T tokens.
void rows_portable(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1);
void rows_vnni(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1);
void quantize_avx512(const float* x, int64_t in, int64_t T, Group* out);
bool cpu_has_vnni();

// Jobs whose weights it takes (see takes), as one parallel pass.
void forward(std::span<const LinearJob> jobs, ThreadPool& pool, bool vnni);

}  // namespace int8
}  // namespace qs
