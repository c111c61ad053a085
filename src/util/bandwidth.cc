#include "util/bandwidth.h"

#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/huge_buffer.h"
#include "util/parallel.h"

namespace qs {
namespace {

constexpr size_t kStep = 256;        // bytes per loop iteration: four independent 64-byte accumulators

// XOR keeps the loop load-bound (one cheap op per load) and gives the compiler a result it cannot drop.
__attribute__((target("avx512f"))) uint64_t read_avx512(const std::byte* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + kStep <= n; i += kStep) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  return _mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const std::byte* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + kStep <= n; i += kStep)
    for (size_t j = 0; j < kStep; j += 128) {  // 8 loads of 32 bytes per step
      a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + j)));
      a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + j + 32)));
      a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + j + 64)));
      a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + j + 96)));
    }
  __m256i x = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return _mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^ _mm256_extract_epi64(x, 2) ^ _mm256_extract_epi64(x, 3);
}

uint64_t read_portable(const std::byte* p, size_t n) {
  uint64_t a[4] = {};
  for (size_t i = 0; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * j, 8);
      a[j] ^= v;
    }
  return a[0] ^ a[1] ^ a[2] ^ a[3];
}

struct Reader {
  uint64_t (*fn)(const std::byte*, size_t);
  const char* isa;
};

Reader pick_reader() {
  if (__builtin_cpu_supports("avx512f")) return {read_avx512, "avx512"};
  if (__builtin_cpu_supports("avx2")) return {read_avx2, "avx2"};
  return {read_portable, "portable"};
}

}  // namespace

struct ReadSweep::State {
  ThreadPool& pool;
  size_t slice;
  HugeBuffer buf;
  Reader reader = pick_reader();
  std::atomic<uint64_t> sink{0};  // the readers' results land here, so the reads cannot be dropped
  State(ThreadPool& p, size_t s) : pool(p), slice(s), buf(s * p.size()) {}
};

ReadSweep::ReadSweep(ThreadPool& pool, uint64_t buffer_bytes) {
  const size_t slice = std::max<size_t>(kStep, buffer_bytes / pool.size() / kStep * kStep);
  state_ = std::make_unique<State>(pool, slice);
  State& s = *state_;
  s.pool.parallel_for(s.pool.size(), 1, [&](size_t a, size_t b) {
    for (size_t t = a; t < b; ++t) std::memset(s.buf.data() + t * s.slice, int(t + 1), s.slice);
  });
}

ReadSweep::~ReadSweep() = default;

double ReadSweep::pass() {
  State& s = *state_;
  auto t0 = std::chrono::steady_clock::now();
  s.pool.parallel_for(s.pool.size(), 1, [&](size_t a, size_t b) {
    for (size_t t = a; t < b; ++t) s.sink ^= s.reader.fn(s.buf.data() + t * s.slice, s.slice);
  });
  return double(s.buf.size()) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t ReadSweep::bytes() const { return state_->buf.size(); }
const char* ReadSweep::isa() const { return state_->reader.isa; }

BandwidthResult measure_read_bandwidth(ThreadPool& pool, uint64_t buffer_bytes, int passes) {
  ReadSweep sweep(pool, buffer_bytes);
  double best = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass) best = std::max(best, sweep.pass());
  return {best, sweep.bytes(), pool.size(), std::max(1, passes), sweep.isa()};
}

}  // namespace qs
