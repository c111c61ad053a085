#include "kernels/linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "formats/dtype.h"
#include "kernels/isa.h"
#include "kernels/linear_int8.h"
#include "kernels/linear_isa.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/huge_buffer.h"
#include "util/parallel.h"

namespace qs {
namespace {

// --- portable path: a row dequantised to f32, then dots ------------------------------------------------------

void linear_portable(const LinearWeight& w, const float* x, int64_t T, float* y, size_t r0, size_t r1) {
  std::vector<float> row(w.in);
  for (size_t o = r0; o < r1; ++o) {
    w.dequantize_row(o, row.data());
    for (int64_t t = 0; t < T; ++t) y[t * w.out + o] = dot(x + t * w.in, row.data(), w.in);
  }
}

}  // namespace

uint64_t LinearWeight::bytes() const {
  return kind == WeightKind::BF16 ? uint64_t(out) * in * 2 : uint64_t(out) * in / 2 + uint64_t(out) * (in / group) * 2;
}

const char* int4_layout_name(Int4Layout layout) {
  constexpr const char* kNames[] = {"rows", "tiles", "columns", "blocks", "lanes"};
  return kNames[static_cast<int>(layout)];
}

void LinearWeight::dequantize_row(int64_t row, float* out_row) const {
  if (kind == WeightKind::BF16) {
    const std::byte* p = values + uint64_t(row) * in * 2;
    for (int64_t c = 0; c < in; ++c) out_row[c] = bf16_to_f32(load_unaligned<uint16_t>(p + c * 2));
    return;
  }
  uint8_t levels[32];
  for (int64_t g = 0; g < in / group; ++g) {
    const float s = bf16_to_f32(load_unaligned<uint16_t>(scales + scale_offset(row, g)));
    stored_levels(row, g, levels);
    for (int k = 0; k < 32; ++k) out_row[g * group + k] = round_to_bf16(static_cast<float>(int(levels[k]) - 8) * s);
  }
}

void LinearWeight::stored_levels(int64_t r, int64_t g, uint8_t (&levels)[32]) const {
  const std::byte* at = values + nibble_offset(r, g);
  if (layout == Int4Layout::Lanes) return lanes_levels(at, levels);
  for (int k = 0; k < 32; ++k) {
    const int64_t byte = layout == Int4Layout::Blocks ? k / 8 * 64 + k / 2 % 4 : k / 2;  // Rows and Tiles: k / 2
    levels[k] = layout == Int4Layout::Columns ? (load_unaligned<uint16_t>(at + k * 2) >> (r % kTileRows * 4)) & 15
                                              : (static_cast<unsigned>(at[byte]) >> (k % 2 * 4)) & 15;
  }
}

LinearWeight LinearWeight::rows(int64_t first, int64_t count) const {
  LinearWeight w = *this;
  w.out = count;
  if (kind == WeightKind::BF16) {
    w.values = values + uint64_t(first) * in * 2;
  } else {
    if (first % unit_rows() || count % unit_rows())
      throw Error(fmt::format("a slice of rows {}..{} of a tiled int4 weight must start and end on a tile of {}",
                              first, first + count, unit_rows()));
    w.values = values + nibble_offset(first, 0);
    w.scales = scales + scale_offset(first, 0);
  }
  return w;
}

namespace {
// Group g of a tile's four Rows-layout rows (16 bytes each, `row_step` apart) as a Columns line: word c holds
// column c's nibble of row r in bits 4r..4r+3.
void columns_line(const std::byte* rows, uint64_t row_step, std::byte* line) {
  uint64_t words[8] = {};  // four columns' words each
  for (int r = 0; r < kTileRows; ++r)
    for (int m = 0; m < 8; ++m) {
      // Two bytes of the row (columns 4m..4m+3) spread to one nibble per 16 bits.
      uint64_t x = load_unaligned<uint16_t>(rows + r * row_step + 2 * m);
      x = (x | x << 24) & 0x000000ff000000ffull;
      x = (x | x << 12) & 0x000f000f000f000full;
      words[m] |= x << (4 * r);
    }
  std::memcpy(line, words, sizeof words);  // little-endian: word c of the line is bits 16(c % 4) of words[c / 4]
}

// A Rows-layout row's group (16 bytes) as a Lanes group: byte i's nibbles are columns lanes_column(i, 0) and (i, 1).
void lanes_group(const std::byte* row, std::byte* group) {
  auto level = [&](int c) { return (static_cast<unsigned>(row[c / 2]) >> (c % 2 * 4)) & 15; };
  for (int i = 0; i < 16; ++i)
    group[i] = static_cast<std::byte>(level(lanes_column(i, 0)) | level(lanes_column(i, 1)) << 4);
}

// Group g of a block's sixteen Rows-layout rows (16 bytes each, `row_step` apart) as four Blocks lines: word r of
// line j is row r's word j.
void block_lines(const std::byte* rows, uint64_t row_step, std::byte* lines) {
  uint32_t words[4][kBlockRows];
  for (int r = 0; r < kBlockRows; ++r) {
    uint32_t row[4];
    std::memcpy(row, rows + r * row_step, sizeof row);
    for (int j = 0; j < 4; ++j) words[j][r] = row[j];
  }
  std::memcpy(lines, words, sizeof words);
}
}  // namespace

LinearWeight tiled(const LinearWeight& w, HugeBuffer& storage, ThreadPool& pool, Int4Layout layout) {
  if (w.kind != WeightKind::Int4 || w.group != 32 || w.out % kTileRows || w.layout != Int4Layout::Rows ||
      layout == Int4Layout::Rows)
    return w;
  if (layout == Int4Layout::Blocks && w.out % kBlockRows) layout = Int4Layout::Tiles;
  const uint64_t groups = w.in / w.group, nibbles = uint64_t(w.out) * w.in / 2;
  storage = HugeBuffer(nibbles + uint64_t(w.out) * groups * 2);
  LinearWeight t = w;
  t.layout = layout;
  t.values = storage.data();
  t.scales = storage.data() + nibbles;
  const int64_t unit = t.unit_rows();
  pool.parallel_for(w.out / unit, 64 / unit, [&](size_t u0, size_t u1) {
    for (size_t first = u0 * unit; first < u1 * unit; first += unit)
      for (uint64_t g = 0; g < groups; ++g) {
        if (layout == Int4Layout::Columns)
          columns_line(w.values + w.nibble_offset(first, g), groups * 16, storage.data() + t.nibble_offset(first, g));
        if (layout == Int4Layout::Blocks)
          block_lines(w.values + w.nibble_offset(first, g), groups * 16, storage.data() + t.nibble_offset(first, g));
        for (size_t r = first; r < first + unit; ++r) {
          if (layout == Int4Layout::Tiles)
            std::memcpy(storage.data() + t.nibble_offset(r, g), w.values + w.nibble_offset(r, g), 16);
          if (layout == Int4Layout::Lanes)
            lanes_group(w.values + w.nibble_offset(r, g), storage.data() + t.nibble_offset(r, g));
          std::memcpy(storage.data() + nibbles + t.scale_offset(r, g), w.scales + w.scale_offset(r, g), 2);
        }
      }
  });
  return t;
}

void linear_forward(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool,
                    Activations activations) {
  const LinearJob job{&w, x, T, y};
  linear_forward(std::span(&job, 1), pool, activations);
}

namespace {

// The vector kernels take bf16 weights of any width and int4 weights in whole groups of 32.
bool vector_kernels_take(const LinearWeight& w) { return w.kind == WeightKind::BF16 || (w.group == 32 && w.in % 32 == 0); }

}  // namespace

const float* int4_level_table() {
  static const float* table = [] {
    auto* t = static_cast<float*>(std::aligned_alloc(64, 65536 * 16 * sizeof(float)));
    for (uint32_t s = 0; s < 65536; ++s) {
      const float scale = bf16_to_f32(static_cast<uint16_t>(s));
      for (int n = 0; n < 16; ++n) t[s * 16 + n] = round_to_bf16(static_cast<float>(n - 8) * scale);
    }
    return t;
  }();
  return table;
}

const uint8_t* int4_level_bytes() {
  static const uint8_t* table = [] {
    const float* levels = int4_level_table();
    auto* t = static_cast<uint8_t*>(std::aligned_alloc(64, 65536 * 32));
    for (uint32_t i = 0; i < 65536 * 16; ++i) {
      const uint16_t bf16 = std::bit_cast<uint32_t>(levels[i]) >> 16;
      t[i / 16 * 32 + i % 16] = bf16 & 0xff;
      t[i / 16 * 32 + 16 + i % 16] = bf16 >> 8;
    }
    return t;
  }();
  return table;
}

const uint16_t* int4_level_words() {
  static const uint16_t* table = [] {
    const float* levels = int4_level_table();
    auto* t = static_cast<uint16_t*>(std::aligned_alloc(64, 65536 * 16 * sizeof(uint16_t)));
    for (uint32_t i = 0; i < 65536 * 16; ++i) t[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(levels[i]) >> 16);
    return t;
  }();
  return table;
}

bool multiplies_by_bf16_dot_products(Activations activations) {
  return activations == Activations::BF16 && kernel_isa() == Isa::Avx512 && bf16_dot_products_used();
}

Int4Layout fastest_int4_layout(Activations activations) {
  if (multiplies_by_bf16_dot_products(activations)) return Int4Layout::Columns;
  if (activations == Activations::Int8) return kernel_isa() == Isa::Avx512 && int8::cpu_has_vnni() ? Int4Layout::Blocks
                                                                                             : Int4Layout::Tiles;
  return kernel_isa() == Isa::Avx2 ? Int4Layout::Lanes : Int4Layout::Tiles;
}

void linear_forward(std::span<const LinearJob> jobs, ThreadPool& pool, Activations activations) {
  if (activations == Activations::Int8) {  // int4 tiles quantize their inputs; the rest keep bf16 activations
    thread_local std::vector<LinearJob> w4a8, rest;  // the caller's, reused
    w4a8.clear(), rest.clear();
    reserve_job_list(w4a8, jobs.size()), reserve_job_list(rest, jobs.size());
    for (const LinearJob& j : jobs) (int8::takes(*j.w) ? w4a8 : rest).push_back(j);
    if (!w4a8.empty()) int8::forward(w4a8, pool, kernel_isa() == Isa::Avx512 && int8::cpu_has_vnni());
    if (rest.empty()) return;
    return linear_forward(rest, pool, Activations::BF16);
  }
  const Isa isa = kernel_isa();
  const bool vector = isa != Isa::Portable &&
                      std::all_of(jobs.begin(), jobs.end(), [](const LinearJob& j) { return vector_kernels_take(*j.w); });
  const bool round = activations == Activations::BF16;
  if (vector && isa == Isa::Avx512) return linear_forward_avx512(jobs, pool, round);
  if (vector) return linear_forward_avx2(jobs, pool, round);
  for (const LinearJob& j : jobs) {
    std::vector<float> rounded;
    const float* x = j.x;
    if (round) {
      rounded.assign(x, x + j.T * j.w->in);
      round_to_bf16(rounded);
      x = rounded.data();
    }
    pool.parallel_for(j.w->out, 16, [&](size_t r0, size_t r1) { linear_portable(*j.w, x, j.T, j.y, r0, r1); });
  }
}

}  // namespace qs
