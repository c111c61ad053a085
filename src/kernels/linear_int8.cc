#include "kernels/linear_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/dtype.h"
#include "kernels/linear.h"
#include "kernels/linear_isa.h"
#include "util/parallel.h"

namespace qs::int8 {
namespace {

constexpr int64_t kGroup = 32;

int8_t quantized(float x, float d) { return d == 0 ? 0 : static_cast<int8_t>(std::clamp(std::nearbyint(x / d), -127.0f, 127.0f)); }

}  // namespace

bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return has;
}

bool takes(const LinearWeight& w) { return w.kind == WeightKind::Int4 && w.in_tiles(); }

void quantize(const float* x, int64_t in, int64_t T, Group* out) {
  const int64_t groups = in / kGroup;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = x + t * in + g * kGroup;
      Group& q = out[t * groups + g];
      float amax = 0;
      for (int i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(v[i]));
      q.scale = amax / 127.0f;
      int32_t sum = 0;
      for (int k = 0; k < 16; ++k) {
        q.q[k] = quantized(v[2 * k], q.scale), q.q[16 + k] = quantized(v[2 * k + 1], q.scale);
        sum += q.q[k] + q.q[16 + k];
      }
      q.start = -8 * sum;
      std::fill(std::begin(q.unused), std::end(q.unused), 0.0f);
    }
}

void rows_portable(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  const int64_t groups = w.in / kGroup;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        const Group& a = x[t * groups + g];
        const float sd = bf16_to_f32(load_unaligned<uint16_t>(w.scales + w.scale_offset(r, g))) * a.scale;
        uint8_t levels[32];
        w.stored_levels(r, g, levels);
        int32_t dot = a.start;
        for (int k = 0; k < 16; ++k) dot += levels[2 * k] * a.q[k] + levels[2 * k + 1] * a.q[16 + k];
        acc = std::fma(static_cast<float>(dot), sd, acc);
      }
      y[t * w.out + r] = acc;
    }
}

void forward(std::span<const LinearJob> jobs, ThreadPool& pool, bool vnni) {
  // Every job's activations quantized once; jobs with the same input share them.
  thread_local std::vector<size_t> offsets, fresh;  // the caller's, reused; workers see them through pointers
  reserve_job_list(offsets, jobs.size()), reserve_job_list(fresh, jobs.size());
  offsets.resize(jobs.size());
  fresh.clear();
  size_t* offset = offsets.data();
  size_t groups = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    auto same = std::find_if(fresh.begin(), fresh.end(), [&](size_t f) {
      return jobs[f].x == jobs[k].x && jobs[f].T == jobs[k].T && jobs[f].w->in == jobs[k].w->in;
    });
    if (same != fresh.end()) {
      offset[k] = offset[*same];
      continue;
    }
    fresh.push_back(k);
    offset[k] = groups;
    groups += jobs[k].T * jobs[k].w->in / kGroup;
  }
  thread_local std::vector<Group> buffer;  // the caller's: workers read it through `quantized`
  buffer.resize(groups);
  Group* quantized = buffer.data();
  for (size_t k : fresh)
    (vnni ? quantize_avx512 : quantize)(jobs[k].x, jobs[k].w->in, jobs[k].T, quantized + offset[k]);
  // Work is split at the weights' units (tiles of four rows, blocks of sixteen), which the kernels take whole.
  int64_t units = 0;
  for (const LinearJob& j : jobs) units += j.w->out / j.w->unit_rows();
  pool.parallel_for(units, 1, [&](size_t u0, size_t u1) {
    int64_t first = 0;  // the current matrix's first unit, among the units of all
    for (size_t k = 0; k < jobs.size(); ++k) {
      const LinearWeight& w = *jobs[k].w;
      const int64_t n = w.out / w.unit_rows();
      const int64_t a = std::max<int64_t>(u0, first) - first, b = std::min<int64_t>(u1, first + n) - first;
      first += n;
      if (a >= b) continue;
      // The VNNI kernel reads Blocks; the other layouts (chosen for other activations) take the portable code.
      const auto rows = vnni && w.layout == Int4Layout::Blocks ? rows_vnni : rows_portable;
      rows(w, quantized + offset[k], jobs[k].T, jobs[k].y, a * w.unit_rows(), b * w.unit_rows());
    }
  });
}

}  // namespace qs::int8
