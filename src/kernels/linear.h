#pragma once
// Linear layers over bf16 [out, in] or W4A16 int4 weights: bf16 read in place from the memory map; int4 either as
// the checkpoint stores it (packed levels [out, in/8], bf16 scales [out, in/group]) or copied at load into the
// kernels' streaming layout (rows interleaved in tiles of four). Activations are f32 rows; accumulation is f32. An
// int4 weight is dequantized to bf16(level x scale), the value the bf16 QAT export stores, so both formats of one
// model compute the same products.
#include <cstddef>
#include <cstdint>
#include <span>

namespace qs {

class HugeBuffer;
class ThreadPool;

enum class WeightKind { BF16, Int4 };

// Where an int4 weight's bytes lie. Rows: as compressed-tensors stores them. Tiles: rows in tiles of four, per
// tile and group of 32 columns the four rows' 16 nibble bytes side by side (one cache line), the scales likewise
// ([tile][group][4] bf16): a core reads one stream of nibbles and one of scales, which the memory system serves
// faster than eight interleaved row streams (measured: 36 -> 44 G weights/s from memory on 2 cores).
// Columns: the tiles of Tiles, but a line holds per column one 16-bit word of the four rows' nibbles (row r in
// bits 4r..4r+3), so that a shift and a mask give a row's 32 levels in 16-bit lanes, as one word permute and one
// bf16 dot product take them: 1.75 shuffle-class instructions a group and row instead of 3 (the kernels with bf16
// dot products; the others read it too).
// Blocks: rows in blocks of sixteen; per block and group four 64-byte lines, line j holding each row's packed word
// j (columns 8j..8j+7: row r in bytes 4r..4r+3), the scales [block][group][16] bf16. One VNNI dot product then
// takes a line's sixteen rows against one 4-byte activation broadcast (W4A8: linear_int8.h); the others read it
// too. Weights whose rows are no multiple of sixteen get Tiles instead.
// Lanes: Tiles with each row's 32 nibbles reordered for AVX2 (lanes_column): the low nibbles of a group's 16 bytes
// are the levels one 128-bit lane looks up, the high nibbles the other's, so a shift and a mask of the group read
// twice give them, without the byte shuffle Rows order takes (AVX2 in cache: ~10% faster).
enum class Int4Layout { Rows, Tiles, Columns, Blocks, Lanes };
inline constexpr int64_t kTileRows = 4, kBlockRows = 16;
const char* int4_layout_name(Int4Layout layout);  // "rows", "tiles", "columns", "blocks", "lanes"

// Lanes: the column whose level is the low (h = 0) or high (h = 1) nibble of byte i (0-15) of a row's group. AVX2's
// first 128-bit lane looks up the 16 low nibbles (columns 0-7 and 16-23), the second the 16 high ones (8-15 and
// 24-31), each in the order its kernel then keeps the column pairs in (linear_avx2.cc).
constexpr int lanes_column(int i, int h) {
  const int q = i % 8;
  return 2 * ((q < 4 ? q : q + 4) + 4 * h) + i / 8;
}
// A Lanes group's 16 bytes as its 32 stored levels (0-15), column by column.
inline void lanes_levels(const std::byte* group, uint8_t (&levels)[32]) {
  for (int i = 0; i < 16; ++i)
    for (int h = 0; h < 2; ++h) levels[lanes_column(i, h)] = (static_cast<unsigned>(group[i]) >> (4 * h)) & 15;
}

// Rows of a layout's unit (a tile or a block), which slices and the work split keep whole: 1 for Rows.
constexpr int64_t unit_rows_of(Int4Layout layout) {
  return layout == Int4Layout::Rows ? 1 : layout == Int4Layout::Blocks ? kBlockRows : kTileRows;
}
// Byte offsets of group g of row r in a weight of `groups` groups a row: its nibbles (Rows and Tiles: the row's 16
// bytes; Columns: the tile's 64-byte line; Blocks: the row's first word), its bf16 scale. Inline, so that a kernel
// that knows the layout at compile time finds a tile's pointers by shifts, not divisions.
constexpr uint64_t int4_nibble_offset(Int4Layout layout, uint64_t groups, int64_t r, int64_t g) {
  const uint64_t unit = unit_rows_of(layout);
  const uint64_t lines = (r / unit * groups + g) * unit * 16;  // the unit's group: 16 bytes a row
  if (layout == Int4Layout::Columns) return lines;
  if (layout == Int4Layout::Blocks) return lines + r % unit * 4;  // word j of the row's group 64 j bytes further
  return lines + r % unit * 16;  // Rows (a unit of one row), Tiles and Lanes
}
constexpr uint64_t int4_scale_offset(Int4Layout layout, uint64_t groups, int64_t r, int64_t g) {
  const uint64_t unit = unit_rows_of(layout);
  return ((r / unit * groups + g) * unit + r % unit) * 2;
}

struct LinearWeight {
  int64_t out = 0, in = 0;
  WeightKind kind = WeightKind::BF16;
  const std::byte* values = nullptr;  // bf16 [out, in], or int4 words [out, in/8]
  const std::byte* scales = nullptr;  // bf16 [out, in/group] for Int4
  int64_t group = 32;
  Int4Layout layout = Int4Layout::Rows;

  uint64_t bytes() const;                     // weight bytes read per use
  void dequantize_row(int64_t row, float* out_row) const;
  LinearWeight rows(int64_t first, int64_t count) const;  // a slice of output rows (e.g. one expert's gate)
  // Byte offsets of group g of row r: its nibbles in `values`, its scale in `scales` (int4_nibble_offset).
  uint64_t nibble_offset(int64_t r, int64_t g) const { return int4_nibble_offset(layout, in / group, r, g); }
  uint64_t scale_offset(int64_t r, int64_t g) const { return int4_scale_offset(layout, in / group, r, g); }
  // int4: the stored nibbles (0-15) of group g of row r, column by column, in any layout.
  void stored_levels(int64_t r, int64_t g, uint8_t (&levels)[32]) const;
  bool in_tiles() const { return layout != Int4Layout::Rows; }  // Tiles, Columns, Blocks or Lanes
  int64_t unit_rows() const { return unit_rows_of(layout); }
};

// An int4 weight of group 32 whose rows are a multiple of four, copied into `storage` (on huge pages) in `layout`
// (Tiles, Columns, or Blocks where the rows are a multiple of sixteen, else Tiles); any other weight comes back as
// it is.
LinearWeight tiled(const LinearWeight& w, HugeBuffer& storage, ThreadPool& pool, Int4Layout layout = Int4Layout::Tiles);

// F32: activations used as f32 (the parity reference). BF16: activations rounded to bf16 first, as in a bf16
// model (W4A16's 16-bit activations); bf16 x bf16 products are exact in f32. Both accumulate in f32.
// Int8 (opt-in, lossy: W4A8): for int4 weights in tiles or blocks, activations quantized to int8 per token and group
// of 32 (scale amax / 127), each group's integer dot product (VNNI on Blocks where the CPU has it) scaled by weight
// scale x activation scale; other weights get BF16 activations. Twice the multiply-adds per instruction of bf16 dot
// products (linear_int8.h).
enum class Activations { F32, BF16, Int8 };

// y[t, o] = sum_i x[t, i] * W[o, i] for t < T (row strides: in for x, out for y).
void linear_forward(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool,
                    Activations activations = Activations::F32);
// One of several independent products run together: y = W x over T tokens.
struct LinearJob {
  const LinearWeight* w;
  const float* x;
  int64_t T;
  float* y;
};
// Independent products (q/k/v of one input, the experts a step's tokens chose) as one job over all their rows:
// each result has the bits it gets alone, and the threads stay busy and their memory streams unbroken from one
// matrix to the next instead of meeting after each.
void linear_forward(std::span<const LinearJob> jobs, ThreadPool& pool, Activations activations = Activations::F32);
// Both run with kernels/isa.h's instruction set: AVX-512 and AVX2 give the same bits (one canonical order of
// operations, kernels/linear_simd.h), the portable path (a row dequantised, then ops.h's dot) sums in another order.

// How AVX-512 multiplies bf16 activations, the same bits either way. Auto (the default): by bf16 dot products
// (vdpbf16ps) where the CPU has AVX512_BF16, the instruction gives the canonical order's bits on a table of edge
// cases and it is faster than f32 FMA (both checked once, timed on an in-cache matrix); else by f32 FMA. Fma and
// DotProducts (wherever exact) let tests and benchmarks run either.
enum class Bf16Multiply { Auto, Fma, DotProducts };
void set_bf16_multiply(Bf16Multiply how);
bool bf16_dot_products_used();  // under the current setting, by AVX-512 with bf16 activations
// Whether linears taking these activations multiply by bf16 dot products: AVX-512 kernels, bf16 activations, and
// bf16_dot_products_used().
bool multiplies_by_bf16_dot_products(Activations activations);
// The int4 layout a model loaded for these activations gets: Columns where the bf16 dot products will run (the
// kernel set and the multiply chosen now), Blocks where int8 activations meet AVX-512 VNNI, Lanes for AVX2's bf16 and
// f32 activations, Tiles otherwise (every kernel reads every layout; Columns, Blocks and Lanes only at speed there).
Int4Layout fastest_int4_layout(Activations activations);

}  // namespace qs
