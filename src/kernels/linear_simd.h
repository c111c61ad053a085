#pragma once
// The vector linear kernels, written once over a vector type V and compiled per instruction set: linear_avx512.cc
// (one zmm register holds V's 16 lanes; with f32 FMA, or with bf16 dot products where the CPU has them) and
// linear_avx2.cc (two ymm registers). Include only from those files, which define QS_SIMD, the target attribute of
// their instruction set, before including this; linear.cc runs each only where the CPU has it. (Target attributes
// rather than per-file -m flags: the standard library functions these files instantiate must stay compiled for
// any x86-64, as the linker keeps one copy of each for the whole program.)
//
// Weights are decoded in registers: int4 weights become bf16(level x scale), the value the bf16 QAT export stores,
// by a lookup in the table of all 16 levels for the group's scale, found by the scale's bit pattern (a load, no
// arithmetic), so the int4 and bf16 forms of one model give bit-identical results. bf16 x bf16 products are exact
// in f32. Where the CPU has AVX512_BF16 and the activations are bf16, one vdpbf16ps multiplies and adds a whole
// group (32 columns) into 16 lanes: half the multiply instructions of f32 FMA and one lookup of 32 bf16 levels
// instead of two of 16 f32 ones, which moved decode from compute-bound to memory-bound on AMD Zen 4.
//
// Work goes by tiles of four rows (linear.h's Int4Layout::Tiles keeps a tile's rows in one stream), each tile over
// four tokens at a time with weights decoded in registers, or, for prompts, decoded once per block of tokens.
//
// One canonical order of operations per (output row, token), whatever the batch and whichever instruction set:
// group after group of 32 columns, lane k of one 16-lane f32 accumulator taking the column pair (2k, 2k + 1),
// first the odd column's product, then the even one's, each added with one rounding (an FMA), denormal inputs read
// as zero and denormal results flushed to zero; then one fixed tree over the lanes. That is vdpbf16ps's definition
// (Intel SDM: "FP32 FMA with DAZ in, FTZ out and RNE rounding", odd element first); the f32 FMA paths compute it
// with MXCSR's DAZ and FTZ set while they run, and vdpbf16ps is used only where it gives those bits on a table of
// edge cases (linear_avx512.cc). A token therefore gets the same bits alone, in a decode batch or in a long
// prefill, on every instruction set.
//
// V provides simd_lanes.h's F (16 f32 lanes), zero and sum (its fixed tree); G, one group of 32 values as the
// kernel multiplies them (weights or activations), with load_group/store_group (kRoom floats of room each),
// mac(acc, weights, activations) in the canonical order, int4_group (a group's 16 nibble bytes and its scale's
// levels, kLevelStride entries of level_table() per scale), bf16_group (32 bf16 weights) and activation_group (32
// f32 activations, optionally rounded to bf16).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "kernels/linear.h"
#include "kernels/linear_isa.h"
#include "kernels/simd_lanes.h"
#include "util/parallel.h"

#ifndef QS_SIMD
#error "define QS_SIMD (the instruction set's target attribute) before including kernels/linear_simd.h"
#endif

namespace qs {

// f32(bf16(level x scale)) for every bf16 bit pattern of a scale and stored nibble (linear.cc).
const float* int4_level_table();
// The same levels as bf16 in two 16-byte tables per scale, low bytes then high bytes (linear.cc): AVX2 looks
// them up by byte shuffles, as its permutes reach only 8 lanes.
const uint8_t* int4_level_bytes();
// The same levels as bf16 words, 16 per scale (linear.cc): vdpbf16ps's operands.
const uint16_t* int4_level_words();

namespace simd {

constexpr int64_t kGroup = 32;   // columns per step: an int4 group, as 16 even and 16 odd columns
constexpr int kRows = kTileRows;  // rows per tile
// Up to this many tokens, weights are decoded in registers per tile of four tokens (measured on E2B, 8 to 16 decode
// streams: 1.1-1.3x faster than decoding the rows once into L1, whose rows of a wide matrix spill to L2).
constexpr int64_t kFewTokens = 16;
// Beyond, rows are decoded once per block of tokens whose activations stay in L2 (2 MB a core here).
constexpr int64_t kTokenBlockBytes = 768 << 10;

inline int64_t groups_of(int64_t in) { return (in + kGroup - 1) / kGroup; }

// A group as two f32 vectors, the 16 even columns and the 16 odd ones, multiplied by f32 FMA: the odd product
// first, as the canonical order has it.
template <typename Lanes>
struct FmaPairs : Lanes {
  using F = typename Lanes::F;
  struct G {
    F even, odd;
  };
  static constexpr int64_t kRoom = 32;  // floats a stored group takes
  static constexpr int kTileTokens = 4;  // a tile's tokens at most
  static constexpr int kTileCells = kRows * kTileTokens;  // (row, token) accumulators a pass holds: a whole tile
  static constexpr bool kRowByRow = false;  // see multiply_group
  static QS_SIMD QS_INLINE G load_group(const float* p) { return {Lanes::load(p), Lanes::load(p + 16)}; }
  static QS_SIMD QS_INLINE void store_group(float* p, const G& g) {
    Lanes::store(p, g.even), Lanes::store(p + 16, g.odd);
  }
  static QS_SIMD QS_INLINE F mac(F acc, const G& w, const G& x) {
    return Lanes::fma(w.even, x.even, Lanes::fma(w.odd, x.odd, acc));
  }
  static QS_SIMD QS_INLINE float total(F acc) { return Lanes::sum(acc); }  // lane k holding column pair k
};

// A thread's work buffer of n floats on a cache-line boundary, so that no vector load of it splits a line.
inline float* line_aligned(std::vector<float>& buffer, int64_t n) {
  buffer.resize(n + 16);
  auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - address % 64) % 64) / sizeof(float);
}

// --- activations: f32 rows -> per group V::kRoom floats holding V's G, zero past `in` ---------------------------

template <typename V>
QS_SIMD void pack_activations(const float* x, int64_t in, int64_t T, bool round_bf16, float* packed) {
  const int64_t groups = groups_of(in);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * in;
    for (int64_t g = 0; g < groups; ++g) {
      float tail[kGroup] = {};
      const float* cols = row + g * kGroup;
      if ((g + 1) * kGroup > in) cols = static_cast<const float*>(std::memcpy(tail, cols, (in - g * kGroup) * 4));
      V::store_group(packed + (t * groups + g) * V::kRoom, V::activation_group(cols, round_bf16));
    }
  }
}

// --- weight tiles: R consecutive rows, each group of each row as V's G ------------------------------------------

// A Columns line's four rows as Rows bytes (16 a row), for the instruction sets that read rows only: the layout is
// chosen for the bf16 dot products, and a kernel of another instruction set only meets it when switched at run time.
inline void rows_of_columns_line(const std::byte* line, uint8_t (&rows)[kRows][16]) {
  uint16_t words[32];
  std::memcpy(words, line, sizeof words);
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < 16; ++k)
      rows[r][k] = static_cast<uint8_t>((words[2 * k] >> (4 * r) & 15) | (words[2 * k + 1] >> (4 * r) & 15) << 4);
}

// Four consecutive rows of a Blocks group (linear.h; `words` at the first one's word 0) as Rows bytes (16 a row):
// the layout is chosen for the VNNI kernel, and the others meet it only when switched at run time.
inline void rows_of_block_lines(const std::byte* words, uint8_t (&rows)[kRows][16]) {
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < 4; ++j) std::memcpy(rows[r] + 4 * j, words + 64 * j + 4 * r, 4);
}

// A Lanes group (linear.h) as a Rows group's 16 bytes, for the instruction sets without a Lanes decode: the layout
// is chosen for AVX2, and the others meet it only when switched at run time.
inline void row_of_lanes_group(const std::byte* group, uint8_t (&row)[16]) {
  uint8_t levels[32];
  lanes_levels(group, levels);
  for (int k = 0; k < 16; ++k) row[k] = static_cast<uint8_t>(levels[2 * k] | levels[2 * k + 1] << 4);
}

// Every tile requests a group of its rows ahead (prefetch_ahead<R>) and gives one row of it (row; kLast marks the
// last group, which may be partial): load_rows takes the rows' groups all at once, to be multiplied together, or
// multiply_group each as it is decoded, where V's registers hold one decoded row beside the accumulators, not four.
// rows_from(r) is the same tile without its first r rows, for passes over some of a tile's rows.

// int4 rows in any layout: group g of row r at nibbles + r * row_step + g * kGroupStep, its scale likewise.
// Rows: a row's 16-byte groups follow each other; Tiles: a group's four rows share one 64-byte line; Columns: that
// line by columns (linear.h), the tile's rows decoded together (R is always kRows: tiled weights have whole tiles);
// Blocks: four rows of a block of sixteen, their words in four lines; Lanes: Tiles, each row's nibbles in AVX2's order.
template <typename V, Int4Layout L>
struct Int4Tile {
  using G = typename V::G;
  static constexpr bool kTiles = L != Int4Layout::Rows;
  static constexpr int64_t kGroupStep = L == Int4Layout::Blocks ? 16 * kBlockRows : kTiles ? 16 * kTileRows : 16;
  static constexpr int64_t kScaleGroupStep = kGroupStep / 8;
  const std::byte* nibbles;  // Rows, Tiles: byte k of a row's group holds column 2k (low nibble) and 2k + 1 (high)
  const std::byte* scales;   // bf16
  const typename V::Level* table;  // V::level_table()
  int64_t row_step, scale_row_step;
  int64_t ahead;  // prefetch distance in nibble bytes (scales: an eighth of it)
  int first = 0;  // Columns, Blocks: rows of the line passed over (only row() reads them, as only AVX2 passes)

  Int4Tile rows_from(int r) const {
    Int4Tile rest = *this;
    if constexpr (L == Int4Layout::Columns || L == Int4Layout::Blocks) {
      rest.first += r;
    } else {
      rest.nibbles += r * row_step;
      rest.scales += r * scale_row_step;
    }
    return rest;
  }
  template <int R>
  QS_SIMD QS_INLINE void prefetch_ahead(int64_t g) const {
    const std::byte *n = nibbles + g * kGroupStep, *s = scales + g * kScaleGroupStep;
    if constexpr (kTiles) {
      prefetch(n + ahead);
      if (g % (64 / kScaleGroupStep) == 0) prefetch(s + ahead / 8);
    } else {
      for (int r = 0; r < R; ++r) {
        if (g % 4 == 0) prefetch(n + r * row_step + ahead);
        if (g % 32 == 0) prefetch(s + r * scale_row_step + ahead / 8);
      }
    }
  }
  template <bool kLast = false>
  QS_SIMD QS_INLINE G row(int64_t g, int r) const {
    const std::byte *n = nibbles + g * kGroupStep, *s = scales + g * kScaleGroupStep;
    if constexpr (L == Int4Layout::Columns || L == Int4Layout::Blocks) {  // met by V only when switched at run time
      r += first;
      uint8_t rows[kRows][16];
      if constexpr (L == Int4Layout::Columns) rows_of_columns_line(n, rows);
      else rows_of_block_lines(n, rows);
      return V::int4_group(reinterpret_cast<const std::byte*>(rows[r]), level_row(s + r * scale_row_step));
    } else if constexpr (L == Int4Layout::Lanes) {
      if constexpr (requires { V::int4_lanes_group; }) {
        return V::int4_lanes_group(n + r * row_step, level_row(s + r * scale_row_step));
      } else {  // met by V only when switched at run time
        uint8_t row[16];
        row_of_lanes_group(n + r * row_step, row);
        return V::int4_group(reinterpret_cast<const std::byte*>(row), level_row(s + r * scale_row_step));
      }
    } else {
      return V::int4_group(n + r * row_step, level_row(s + r * scale_row_step));
    }
  }
  template <int R>  // a Columns line's rows decoded together, where V can
  QS_SIMD QS_INLINE void rows_together(int64_t g, G (&w)[R]) const
    requires(L == Int4Layout::Columns && requires { V::int4_columns; })
  {
    const std::byte *n = nibbles + g * kGroupStep, *s = scales + g * kScaleGroupStep;
    const typename V::Level* levels[kRows];
    for (int r = 0; r < kRows; ++r) levels[r] = level_row(s + r * scale_row_step);
    G all[kRows];
    V::int4_columns(n, levels, all);
    for (int r = 0; r < R; ++r) w[r] = all[r];  // first is 0: only row-by-row kernels pass over part of a tile
  }
  // The scale's levels in V's table, found by its bit pattern.
  QS_SIMD QS_INLINE const typename V::Level* level_row(const std::byte* scale) const {
    uint16_t bits;
    std::memcpy(&bits, scale, 2);
    return table + uint32_t(bits) * V::kLevelStride;
  }
};

template <typename V>
struct Bf16Tile {
  using G = typename V::G;
  const std::byte* values;  // the first row's bf16 weights
  int64_t row_step, in;
  int64_t ahead;  // prefetch distance in bytes

  Bf16Tile rows_from(int r) const { return {values + r * row_step, row_step, in, ahead}; }
  template <int R>
  QS_SIMD QS_INLINE void prefetch_ahead(int64_t g) const {
    for (int r = 0; r < R; ++r) prefetch(values + r * row_step + g * 64 + ahead);
  }
  template <bool kLast = false>  // the last group: 1 to 32 columns, zero-padded
  QS_SIMD QS_INLINE G row(int64_t g, int r) const {
    const std::byte* p = values + r * row_step + g * 64;
    if constexpr (!kLast) return V::bf16_group(p);
    std::byte tail[64] = {};
    std::memcpy(tail, p, (in - g * kGroup) * 2);
    return V::bf16_group(tail);
  }
};

template <typename V>
struct DecodedTile {  // rows already decoded as a tile gives them: per group V's G in V::kRoom floats
  using G = typename V::G;
  const float* rows;
  int64_t row_step;

  DecodedTile rows_from(int r) const { return {rows + r * row_step, row_step}; }
  template <int R>
  QS_SIMD QS_INLINE void prefetch_ahead(int64_t) const {}
  template <bool kLast = false>
  QS_SIMD QS_INLINE G row(int64_t g, int r) const { return V::load_group(rows + r * row_step + g * V::kRoom); }
};

// --- the tile: R rows x C tokens, each (row, token) summed in the canonical order ------------------------------

// Group g of a tile's R rows: requested ahead, then decoded together where the tile can, else row by row.
template <int R, bool kLast, typename Tile, typename G>
QS_SIMD QS_INLINE void load_rows(const Tile& w, int64_t g, G (&rows)[R]) {
  w.template prefetch_ahead<R>(g);
  if constexpr (requires { w.template rows_together<R>(g, rows); }) {
    w.template rows_together<R>(g, rows);
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) rows[r] = w.template row<kLast>(g, r);
  }
}

// One group of the tile's rows into its accumulators: the rows decoded first, or each multiplied as it is decoded.
template <typename V, int R, int C, bool kLast, typename Tile>
QS_SIMD QS_INLINE void multiply_group(typename V::F (&acc)[R][C], const Tile& w, const float* x, int64_t groups,
                                      int64_t g) {
  using G = typename V::G;
  if constexpr (V::kRowByRow) {
    w.template prefetch_ahead<R>(g);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const G row = w.template row<kLast>(g, r);
#pragma GCC unroll 8
      for (int t = 0; t < C; ++t) acc[r][t] = V::mac(acc[r][t], row, V::load_group(x + (t * groups + g) * V::kRoom));
    }
  } else {
    G rows[R];
    load_rows<R, kLast>(w, g, rows);
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) {
      const G xg = V::load_group(x + (t * groups + g) * V::kRoom);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][t] = V::mac(acc[r][t], rows[r], xg);
    }
  }
}

template <typename V, int R, int C, typename Tile>
QS_SIMD void tile(const Tile& w, const float* x, int64_t in, float* y, int64_t out) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  typename V::F acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) acc[r][t] = V::zero();
  for (int64_t g = 0; g < full; ++g) multiply_group<V, R, C, false>(acc, w, x, groups, g);
  if (full < groups) multiply_group<V, R, C, true>(acc, w, x, groups, full);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) y[t * out + r] = V::total(acc[r][t]);
}

// R rows x C tokens in passes of as many rows as V's registers hold accumulators for (V::kTileCells (row, token)
// cells): all R at once with AVX-512's 32 registers, fewer rows a pass with AVX2's 16 when C > 1.
template <typename V, int R, int C, typename Tile>
QS_SIMD QS_INLINE void tile_in_passes(const Tile& w, const float* x, int64_t in, float* y, int64_t out) {
  constexpr int kPass = std::clamp(V::kTileCells / C, 1, R);
  static_assert(kPass == R || V::kRowByRow, "a pass over part of a tile takes its rows one at a time");
  tile<V, kPass, C>(w, x, in, y, out);
  if constexpr (kPass < R) tile_in_passes<V, R - kPass, C>(w.rows_from(kPass), x, in, y + kPass, out);
}

template <typename V, int R, typename Tile, int... C>
QS_SIMD QS_INLINE void tile_of(const Tile& w, const float* x, int64_t in, int64_t n, float* y, int64_t out,
                               std::integer_sequence<int, C...>) {
  ((n == C + 1 ? tile_in_passes<V, R, C + 1>(w, x, in, y, out) : void()), ...);
}

// T tokens in tiles of at most V::kTileTokens, split as evenly as they go (5 as one tile, 7 as 4 + 3): a tile decodes
// its rows' weights once for all its tokens, so a verify of four drafts costs one tile, not a tile of 4 and one of 1.
template <typename V, int R, int kMost = V::kTileTokens, typename Tile>
QS_SIMD void tile_tokens(const Tile& w, const float* x, int64_t in, int64_t T, float* y, int64_t out) {
  const int64_t stride = groups_of(in) * V::kRoom, tiles = (T + kMost - 1) / kMost;
  for (int64_t i = 0, t = 0; i < tiles; ++i) {
    const int64_t n = T / tiles + (i < T % tiles);
    tile_of<V, R>(w, x + t * stride, in, n, y + t * out, out, std::make_integer_sequence<int, kMost>());
    t += n;
  }
}

// The R rows of a tile decoded into `rows` (row_step floats apart), for tiles over many tokens.
template <typename V, int R, typename Tile>
QS_SIMD void decode_tile(const Tile& w, int64_t in, float* rows, int64_t row_step) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  typename V::G weights[R];
  for (int64_t g = 0; g < groups; ++g) {
    if (g < full) load_rows<R, false>(w, g, weights);
    else load_rows<R, true>(w, g, weights);
    for (int r = 0; r < R; ++r) V::store_group(rows + r * row_step + g * V::kRoom, weights[r]);
  }
}

// One tile of R rows over `n` tokens: decoded in registers for a few tokens, else once into `decoded`.
template <typename V, int R, typename Tile>
QS_SIMD void tile_over_tokens(const Tile& w, const float* x, int64_t in, int64_t n, float* y, int64_t out, float* decoded) {
  if (n <= kFewTokens) return tile_tokens<V, R>(w, x, in, n, y, out);
  const int64_t stride = groups_of(in) * V::kRoom;
  decode_tile<V, R>(w, in, decoded, stride);
  // Decoded rows cost nothing to decode again: all four rows a pass, as many tokens as leave room (AVX2: one).
  constexpr int kDecodedTokens = std::min(V::kTileTokens, std::max(1, V::kTileCells / kRows));
  tile_tokens<V, R, kDecodedTokens>(DecodedTile<V>{decoded, stride}, x, in, n, y, out);
}

// Whole tiles [r0, r1) over one tile of C tokens, in one call: a decode token's tile takes a few hundred
// nanoseconds, beside which a call per tile, its pointers and its set-up took ~5% of a decode step (perf).
template <typename V, int C, auto kMake>
[[gnu::flatten]] QS_SIMD void tile_run(const LinearWeight& w, const float* x, float* y, int64_t r0, int64_t r1) {
  for (int64_t o = r0; o < r1; o += kRows) tile_in_passes<V, kRows, C>(kMake(w, o), x, w.in, y + o, w.out);
}

template <typename V, auto kMake, int... C>
QS_SIMD QS_INLINE void tile_run_of(const LinearWeight& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1,
                                   std::integer_sequence<int, C...>) {
  ((n == C + 1 ? tile_run<V, C + 1, kMake>(w, x, y, r0, r1) : void()), ...);
}

// Rows [r0, r1) for all T tokens, each tile of rows made by kMake(w, first row). Up to a tile of tokens, the whole
// tiles go as one run. Many tokens go in blocks whose activations stay in L2 while every tile of the range passes
// (each tile decoded again per block: cheap beside the block's products).
template <typename V, auto kMake>
QS_SIMD void rows_range(const LinearWeight& w, const float* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  if (T <= V::kTileTokens) {
    const int64_t whole = r0 + (r1 - r0) / kRows * kRows;
    tile_run_of<V, kMake>(w, x, T, y, r0, whole, std::make_integer_sequence<int, V::kTileTokens>());
    r0 = whole;
  }
  const int64_t stride = groups_of(w.in) * V::kRoom;
  thread_local std::vector<float> buffer;
  float* decoded = T > kFewTokens ? line_aligned(buffer, kRows * stride) : nullptr;
  const int64_t block = T <= kFewTokens ? T : std::clamp<int64_t>(kTokenBlockBytes / (stride * 4), 16, 256);
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    const float* xb = x + t0 * stride;
    float* yb = y + t0 * w.out;
    for (int64_t o = r0; o < r1; o += kRows) {
      const auto rows = kMake(w, o);
      switch (std::min<int64_t>(kRows, r1 - o)) {
        case 4: tile_over_tokens<V, 4>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 3: tile_over_tokens<V, 3>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 2: tile_over_tokens<V, 2>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 1: tile_over_tokens<V, 1>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        default: break;
      }
    }
  }
}

template <typename V, Int4Layout L>
Int4Tile<V, L> int4_tile(const LinearWeight& w, int64_t o) {
  const bool tiles = L != Int4Layout::Rows;
  const int64_t groups = w.in / kGroup;
  return {w.values + int4_nibble_offset(L, groups, o, 0), w.scales + int4_scale_offset(L, groups, o, 0),
          V::level_table(), L == Int4Layout::Blocks ? 4 : tiles ? 16 : w.in / 2, tiles ? 2 : groups * 2,
          prefetch_distance(w.in / 2)};
}
template <typename V>
Bf16Tile<V> bf16_tile(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in * 2, w.in * 2, w.in, prefetch_distance(w.in * 2)};
}

template <typename V>
QS_SIMD void weight_rows(const LinearWeight& w, const float* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  if (w.kind == WeightKind::BF16) rows_range<V, bf16_tile<V>>(w, x, T, y, r0, r1);
  else if (w.layout == Int4Layout::Tiles) rows_range<V, int4_tile<V, Int4Layout::Tiles>>(w, x, T, y, r0, r1);
  else if (w.layout == Int4Layout::Columns) rows_range<V, int4_tile<V, Int4Layout::Columns>>(w, x, T, y, r0, r1);
  else if (w.layout == Int4Layout::Blocks) rows_range<V, int4_tile<V, Int4Layout::Blocks>>(w, x, T, y, r0, r1);
  else if (w.layout == Int4Layout::Lanes) rows_range<V, int4_tile<V, Int4Layout::Lanes>>(w, x, T, y, r0, r1);
  else rows_range<V, int4_tile<V, Int4Layout::Rows>>(w, x, T, y, r0, r1);
}

// The jobs of one linear_forward call: every job's activations packed once (jobs with the same input share the
// packing), then one parallel pass over all their tiles of rows.
template <typename V>
QS_SIMD void run_jobs(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_bf16) {
  // The caller's buffers, reused (a decode step allocates nothing here); workers see them only through pointers,
  // as a thread_local named in the job would be the worker's own.
  thread_local std::vector<int64_t> offsets;
  thread_local std::vector<size_t> fresh;  // the jobs whose input is packed
  reserve_job_list(offsets, jobs.size()), reserve_job_list(fresh, jobs.size());
  offsets.resize(jobs.size());
  fresh.clear();
  int64_t* offset = offsets.data();
  int64_t floats = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const LinearJob& j = jobs[k];
    auto same = std::find_if(fresh.begin(), fresh.end(), [&](size_t f) {
      return jobs[f].x == j.x && jobs[f].T == j.T && jobs[f].w->in == j.w->in;
    });
    if (same != fresh.end()) {
      offset[k] = offset[*same];
      continue;
    }
    fresh.push_back(k);
    offset[k] = floats;
    floats += j.T * groups_of(j.w->in) * V::kRoom;
  }
  thread_local std::vector<float> buffer;
  float* const packed = line_aligned(buffer, floats);
  for (size_t k : fresh) pack_activations<V>(jobs[k].x, jobs[k].w->in, jobs[k].T, round_bf16, packed + offset[k]);
  // Work is split at tiles of four rows, so that a tiled weight's tiles stay whole.
  int64_t tiles = 0;
  for (const LinearJob& j : jobs) tiles += (j.w->out + kRows - 1) / kRows;
  pool.parallel_for(tiles, 4, [&](size_t t0, size_t t1) {
    const FlushDenormals canonical_rounding;
    int64_t first = 0;  // the current matrix's first tile, among the tiles of all
    for (size_t k = 0; k < jobs.size(); ++k) {
      const LinearWeight& w = *jobs[k].w;
      const int64_t n = (w.out + kRows - 1) / kRows;
      const int64_t a = std::max<int64_t>(t0, first) - first, b = std::min<int64_t>(t1, first + n) - first;
      first += n;
      if (a < b) weight_rows<V>(w, packed + offset[k], jobs[k].T, jobs[k].y, a * kRows, std::min(b * kRows, w.out));
    }
  });
}

}  // namespace simd
}  // namespace qs
