#pragma once
// QAT grid work over whole rows of a bf16 tensor in a memory map: fitting (repack), scanning for groups off
// the grid, and checking stored int4 rows against their source (verify).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quant/qat_grid.h"

namespace qs {

// Rows of a bf16 tensor seen as [rows, cols]; the bytes may sit at any alignment.
struct Bf16Rows {
  const std::byte* base;
  int64_t cols;
  void load(int64_t row, float* out) const;
};

// Fits every group of rows [r0, r1) onto its grid (qat_grid.h): packed gets (r1 - r0) * cols/8 words, scales
// (r1 - r0) * cols/32 bf16 values. Lossless: returns false as soon as a group is off the QAT grid; the lossy
// grids quantize every group and return true. `reproduced`, when given, counts the groups whose every value the
// packed form gives back exactly (bf16(level x scale) == the value, as a bf16 dequantization computes it).
bool fit_rows(const Bf16Rows& view, int64_t r0, int64_t r1, uint32_t* packed, uint16_t* scales,
              RepackGrid grid = RepackGrid::Lossless, std::atomic<uint64_t>* reproduced = nullptr);

struct OffGridGroup {
  int64_t row = 0, group = 0;
  std::vector<float> values;
  float best_error = 0;
};

// The first group (lowest row, then group) off the grid, scanning rows in parallel.
std::optional<OffGridGroup> find_off_grid(const Bf16Rows& view, int64_t rows);
std::string describe_off_grid(const OffGridGroup& g);

}  // namespace qs
