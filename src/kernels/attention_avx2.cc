// attend's vector path (attention_simd.h) with AVX2: two ymm registers a 16-dim block, the same bits as AVX-512.
// Run only where the CPU has AVX2 and FMA (attention.cc).
#define QS_SIMD QS_TARGET_AVX2
#include "kernels/attention_simd.h"

namespace qs::attention {

QS_SIMD void heads_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                        float* out, float* scores, int64_t n) {
  some_heads<simd::Avx2Lanes, FmaPairDots<simd::Avx2Lanes>>(q, heads, d, kv, round_bf16, out, scores, n);
}

QS_SIMD void scores_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                         float* out, int64_t n) {
  some_scores<simd::Avx2Lanes, FmaPairDots<simd::Avx2Lanes>>(q, heads, d, kv, round_bf16, out, n);
}

QS_SIMD void weighted_v_avx2(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                             bool round_bf16, const float* probs, int64_t n, float* out) {
  some_weighted_v<simd::Avx2Lanes, FmaPairDots<simd::Avx2Lanes>>(heads, d, i0, i1, kv, probs, n, round_bf16, out);
}

QS_SIMD void softmax_avx2(float* scores, int64_t heads, int64_t n, bool round_bf16) {
  softmax<simd::Avx2Lanes>(scores, heads, n, round_bf16);
}

}  // namespace qs::attention
