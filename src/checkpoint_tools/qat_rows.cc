#include "checkpoint_tools/qat_rows.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "formats/dtype.h"
#include "quant/qat_grid.h"
#include "quant/w4a16.h"
#include "util/parallel.h"

namespace qs {

void Bf16Rows::load(int64_t row, float* out) const {
  // Widen in place: the row's bf16 bits land in the upper half of out, then shift into f32 positions.
  auto* bits = reinterpret_cast<uint16_t*>(out) + cols;
  std::memcpy(bits, base + static_cast<uint64_t>(row) * cols * 2, cols * 2);
  auto* u = reinterpret_cast<uint32_t*>(out);
  for (int64_t c = 0; c < cols; ++c) u[c] = static_cast<uint32_t>(bits[c]) << 16;
}

bool fit_rows(const Bf16Rows& view, int64_t r0, int64_t r1, uint32_t* packed, uint16_t* scales, RepackGrid grid,
              std::atomic<uint64_t>* reproduced) {
  const int64_t cols = view.cols, groups = cols / kQatGroupSize, words = cols / kLevelsPerWord;
  std::vector<float> values(cols);
  std::vector<int8_t> levels(cols);
  uint64_t exact = 0;
  for (int64_t r = r0; r < r1; ++r) {
    view.load(r, values.data());
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = values.data() + g * kQatGroupSize;
      int8_t* l = levels.data() + g * kQatGroupSize;
      GroupFit fit = fit_group_on(grid, {v, kQatGroupSize}, {l, kQatGroupSize});
      if (!fit.on_grid && grid == RepackGrid::Lossless) return false;
      scales[(r - r0) * groups + g] = fit.scale_bf16;
      const float scale = bf16_to_f32(fit.scale_bf16);
      bool same = true;
      for (int64_t i = 0; i < kQatGroupSize; ++i) same = same && round_to_bf16(l[i] * scale) == v[i];
      exact += same;
    }
    pack_int4(levels, {packed + (r - r0) * words, static_cast<size_t>(words)});
  }
  if (reproduced) reproduced->fetch_add(exact, std::memory_order_relaxed);
  return true;
}

std::optional<OffGridGroup> find_off_grid(const Bf16Rows& view, int64_t rows) {
  const int64_t groups = view.cols / kQatGroupSize;
  std::atomic<int64_t> first_row{INT64_MAX};
  std::mutex mu;
  std::optional<OffGridGroup> found;
  ThreadPool::shared().parallel_for(rows, 16, [&](size_t a, size_t b) {
    std::vector<float> values(view.cols);
    int8_t levels[kQatGroupSize];
    for (int64_t r = a; r < static_cast<int64_t>(b) && r < first_row.load(); ++r) {
      view.load(r, values.data());
      for (int64_t g = 0; g < groups; ++g) {
        std::span<const float> group(values.data() + g * kQatGroupSize, kQatGroupSize);
        GroupFit fit = fit_qat_group(group, levels);
        if (fit.on_grid) continue;
        std::lock_guard lock(mu);
        if (r < first_row.load()) {
          first_row = r;
          found = OffGridGroup{r, g, {group.begin(), group.end()}, fit.max_error};
        }
        return;
      }
    }
  });
  return found;
}

std::string describe_off_grid(const OffGridGroup& g) {
  return fmt::format("row {} group {} is off every 4-bit grid of step amax/m, m = 1..8 (values {}; best error {:.3g})",
                     g.row, g.group, fmt::join(g.values, " "), g.best_error);
}

}  // namespace qs
