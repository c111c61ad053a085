// attend's vector path (attention_simd.h) with AVX2: two ymm registers a 16-dim block, the same bits as AVX-512.
// Run only where the CPU has AVX2 and FMA (attention.cc).
#define QS_SIMD QS_TARGET_AVX2
#include "kernels/attention_simd.h"

namespace qs::attention {

QS_SIMD void heads_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                        float* out, float* scores, int64_t n) {
  some_heads<simd::Avx2Lanes>(q, heads, d, kv, round_bf16, out, scores, n);
}

}  // namespace qs::attention
