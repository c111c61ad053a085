// attend's vector path (attention_simd.h) with AVX-512: one zmm register a 16-dim block. Run only where the CPU
// has AVX-512 (attention.cc).
#define QS_SIMD QS_TARGET_AVX512
#include "kernels/attention_simd.h"

namespace qs::attention {

QS_SIMD void heads_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                          float* out, float* scores, int64_t n) {
  some_heads<simd::Avx512Lanes>(q, heads, d, kv, round_bf16, out, scores, n);
}

}  // namespace qs::attention
