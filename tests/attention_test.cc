// attend() against softmax(q . k) . v computed plainly in double precision, over the shapes the models use and
// more: 1..16 query heads per KV head (E2B: 8), head dims 16..512 (E2B: 256 on sliding layers, 512 on full ones;
// dims that are not a multiple of 16 too), K/V in f32, bf16 or int8 (codes and a scale per position and head)
// cache blocks of 16 positions followed by this call's own f32 rows (as the forward pass hands them over), runs that
// start inside a block (a sliding window), and the bf16 model's rounding of scores and probabilities; with every
// instruction set this CPU has and, with AVX-512, bf16 dot products and f32 FMA, which must also agree bit for bit
// (attention.h promises one order of operations whatever the path).
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "kernels/attention_isa.h"
#include "kernels/attention_softmax.h"
#include "kernels/isa.h"
#include "test_util.h"
#include "util/parallel.h"

namespace qs {
namespace {

constexpr int64_t kBlock = 16;    // positions a cache block holds (KvLayout's default)
constexpr int64_t kKvHeads = 2;   // rows hold two KV heads; the test attends with the second: rows have a stride
constexpr double kUlp = 0x1p-24;  // f32 unit roundoff

struct Case {
  int64_t heads, d;
  int64_t first, cached, chunk;  // positions [first, cached) from cache blocks, then `chunk` rows of this call
  KvDtype cache;
  bool round_bf16;

  std::string name() const {
    const char* dtype = cache == KvDtype::F32 ? " f32 K/V" : cache == KvDtype::BF16 ? " bf16 K/V" : " int8 K/V";
    return "heads " + std::to_string(heads) + " d " + std::to_string(d) + " positions " + std::to_string(first) +
           ".." + std::to_string(cached) + "+" + std::to_string(chunk) + dtype + (round_bf16 ? " bf16 rounding" : "");
  }
};

// K and V of every position as the kernel sees them (f32 values; bf16 ones where the cache holds bf16, scale x
// code where it holds int8), laid out as the paged cache and the forward pass's own rows lay them out.
struct KvData {
  std::vector<std::vector<float>> k, v;                     // [position][d]: the values the reference uses
  std::vector<std::vector<int8_t>> k_codes, v_codes;        // int8: [cached position][d]
  std::vector<float> k_scales, v_scales;                    // int8: [cached position]
  std::vector<std::vector<std::byte>> blocks;               // per block: [K, V][position in block][row bytes]
  std::vector<float> chunk_k, chunk_v;                      // [chunk position][kKvHeads * d]
  std::vector<KvSegment> segments;
};

// Scores must be exact in f32 for the bf16-rounding cases (so that f32 and double round them to the same bf16
// value): there q and k are small multiples of powers of two, whose products and sums of up to 512 terms f32
// represents exactly. Elsewhere they are Gaussian, with q scaled so that scores spread over a few units as after
// Gemma 4's q/k norms.
float draw_q(std::mt19937& rng, const Case& c) {
  if (c.round_bf16) return static_cast<float>(int(rng() % 17) - 8) * 0x1p-4f;
  return std::normal_distribution<float>(0, 2.0f / std::sqrt(float(c.d)))(rng);
}
float draw_k(std::mt19937& rng, const Case& c) {
  if (c.round_bf16) return static_cast<float>(int(rng() % 17) - 8) * 0x1p-3f;
  return std::normal_distribution<float>(0, 1)(rng);
}

// Int8 rows as the cache holds them: codes in -127..127, one of them +-127 (so that amax / 127, the cache's rule,
// gives back the scale), times a scale that is a power of two where scores must be exact (K, with bf16 rounding).
void draw_int8_row(std::mt19937& rng, const Case& c, bool exact, std::vector<int8_t>& codes, float& scale,
                   std::vector<float>& x) {
  codes.resize(c.d);
  for (auto& q : codes) q = static_cast<int8_t>(int(rng() % 255) - 127);
  codes[rng() % c.d] = rng() % 2 ? 127 : -127;
  scale = exact ? 0x1p-7f : std::uniform_real_distribution<float>(0.002f, 0.03f)(rng);
  for (int64_t i = 0; i < c.d; ++i) x[i] = scale * codes[i];
}

void store_value(std::byte* dst, float x, KvDtype dtype) {
  if (dtype == KvDtype::BF16) {
    const uint16_t b = f32_to_bf16(x);
    std::memcpy(dst, &b, 2);
  } else {
    std::memcpy(dst, &x, 4);
  }
}

KvData make_kv(const Case& c, std::mt19937& rng) {
  KvData kv;
  const int64_t n = c.cached - c.first + c.chunk, row = kKvHeads * c.d, offset = c.d;  // second KV head
  const int64_t value_bytes = c.cache == KvDtype::F32 ? 4 : c.cache == KvDtype::BF16 ? 2 : 1;
  const int64_t row_bytes = row * value_bytes + (c.cache == KvDtype::Int8 ? kKvHeads * 4 : 0);
  const int64_t scale_offset = row + 4;  // int8: the second head's scale, after the codes
  std::normal_distribution<float> normal(0, 1);
  for (int64_t p = 0; p < n; ++p) {
    std::vector<float> k(c.d), v(c.d);
    const bool cached = p < c.cached - c.first;
    if (cached && c.cache == KvDtype::Int8) {
      kv.k_codes.emplace_back(), kv.v_codes.emplace_back(), kv.k_scales.emplace_back(), kv.v_scales.emplace_back();
      draw_int8_row(rng, c, c.round_bf16, kv.k_codes.back(), kv.k_scales.back(), k);
      draw_int8_row(rng, c, false, kv.v_codes.back(), kv.v_scales.back(), v);
    } else {
      for (auto& x : k) x = draw_k(rng, c);
      for (auto& x : v) x = normal(rng);
    }
    if (cached && c.cache == KvDtype::BF16)
      for (auto* r : {&k, &v})
        for (auto& x : *r) x = round_to_bf16(x);
    kv.k.push_back(k), kv.v.push_back(v);
  }
  // Cache blocks: every block of [first, cached) allocated on its own, so that segments cannot run together.
  for (int64_t p = c.first; p < c.cached;) {
    const int64_t block_start = p / kBlock * kBlock, count = std::min(c.cached, block_start + kBlock) - p;
    std::vector<std::byte> block(2 * kBlock * row_bytes);
    for (int64_t j = 0; j < count; ++j)
      for (int kind = 0; kind < 2; ++kind) {
        const int64_t q = p - c.first + j;
        std::byte* dst = block.data() + (kind * kBlock + (p - block_start + j)) * row_bytes;
        if (c.cache == KvDtype::Int8) {
          std::memcpy(dst + offset, (kind == 0 ? kv.k_codes : kv.v_codes)[q].data(), c.d);
          std::memcpy(dst + scale_offset, &(kind == 0 ? kv.k_scales : kv.v_scales)[q], 4);
        } else {
          for (int64_t i = 0; i < c.d; ++i)
            store_value(dst + (offset + i) * value_bytes, (kind == 0 ? kv.k : kv.v)[q][i], c.cache);
        }
      }
    kv.blocks.push_back(std::move(block));
    const std::byte* base = kv.blocks.back().data() + (p - block_start) * row_bytes;
    const std::byte* v_base = base + kBlock * row_bytes;
    KvSegment segment{base + offset * value_bytes, v_base + offset * value_bytes, row_bytes, count, c.cache};
    if (c.cache == KvDtype::Int8) segment.k_scale = base + scale_offset, segment.v_scale = v_base + scale_offset;
    segment.position = p;
    kv.segments.push_back(segment);
    p += count;
  }
  kv.chunk_k.resize(c.chunk * row), kv.chunk_v.resize(c.chunk * row);
  for (int64_t j = 0; j < c.chunk; ++j) {
    const int64_t p = c.cached - c.first + j;
    std::copy(kv.k[p].begin(), kv.k[p].end(), kv.chunk_k.begin() + j * row + offset);
    std::copy(kv.v[p].begin(), kv.v[p].end(), kv.chunk_v.begin() + j * row + offset);
  }
  if (c.chunk)
    kv.segments.push_back({reinterpret_cast<const std::byte*>(kv.chunk_k.data() + offset),
                           reinterpret_cast<const std::byte*>(kv.chunk_v.data() + offset),
                           row * int64_t(sizeof(float)), c.chunk, KvDtype::F32, nullptr, nullptr, c.cached});
  return kv;
}

double bf16_of(double x) { return round_to_bf16(static_cast<float>(x)); }

// Whether f32 and double evaluations of x, which may differ by up to `error`, can round to different bf16 values.
bool may_round_either_way(double x, double error) {
  const double a = std::abs(x);
  if (a == 0) return error > 0;
  const double ulp = std::ldexp(1.0, std::ilogb(a) - 7);  // bf16 keeps 8 significant bits
  const double to_midpoint = std::abs(std::fmod(a, ulp) - ulp / 2);
  return to_midpoint <= error;
}

// The reference output of each head, and how far f32 arithmetic may stray from it (the bound below).
struct Reference {
  std::vector<double> out, tolerance;  // [head][d]
};

// Why the tolerance: the kernel rounds in f32, in its own order. A score of d products summed in sixteen lanes and
// a four-level tree is off by at most (d/16 + 5) u sum|q_i k_i| =: E (u = 2^-24). exp(s - max) then carries the
// errors of s and max, the subtraction's (|s - max| u) and its own (u); the sum over n positions adds n u; so a
// probability's relative error is at most 4E + (n + 6 + 2 |s - max|) u. The weighted sum of V adds (n + 1) u
// relative to sum p|v|. An int8 cache adds one rounding to each: the score's product with the K scale (E grows by
// u sum|q_i k_i|) and the probability's with the V scale. The tolerance is twice that first-order bound; probabilities
// under 1e-30, which the kernel drops, add at most 1e-30 sum|v|. With bf16 rounding the scores are exact (see
// draw_q), and a probability within its error of a bf16 rounding midpoint may round either way: that one may move
// by one bf16 ulp (int8: its weight, the product with the V scale rounded to bf16 as attention.h says, by two).
Reference reference(const Case& c, const std::vector<float>& q, const KvData& kv) {
  const int64_t n = static_cast<int64_t>(kv.k.size());
  Reference r{std::vector<double>(c.heads * c.d), std::vector<double>(c.heads * c.d)};
  const int int8 = c.cache == KvDtype::Int8;
  for (int64_t h = 0; h < c.heads; ++h) {
    std::vector<double> score(n), prob(n);
    double max_score = -INFINITY, score_error = 0;
    for (int64_t p = 0; p < n; ++p) {
      double s = 0, magnitude = 0;
      for (int64_t i = 0; i < c.d; ++i) {
        const double term = double(q[h * c.d + i]) * kv.k[p][i];
        s += term, magnitude += std::abs(term);
      }
      score[p] = c.round_bf16 ? bf16_of(s) : s;
      if (!c.round_bf16) score_error = std::max(score_error, (c.d / 16 + 5 + int8) * kUlp * magnitude);
      max_score = std::max(max_score, score[p]);
    }
    double sum = 0, spread = 0;
    for (int64_t p = 0; p < n; ++p) sum += std::exp(score[p] - max_score), spread = std::max(spread, max_score - score[p]);
    const double prob_error = 4 * score_error + (n + 6 + 2 * spread) * kUlp;
    std::vector<double> flip(n, 0.0);  // a probability's possible bf16 rounding flip
    for (int64_t p = 0; p < n; ++p) {
      const double exact = std::exp(score[p] - max_score) / sum;
      prob[p] = c.round_bf16 ? bf16_of(exact) : exact;
      if (prob[p] < 1e-30) prob[p] = 0;
      if (c.round_bf16 && may_round_either_way(exact, 2 * prob_error * exact))
        flip[p] = std::ldexp(1.0, std::ilogb(exact) - 7);
    }
    for (int64_t i = 0; i < c.d; ++i) {
      double o = 0, weighted = 0, flips = 0, values = 0;
      for (int64_t p = 0; p < n; ++p) {
        double v = kv.v[p][i], w = prob[p], moves = 1;
        if (int8 && c.round_bf16 && p < int64_t(kv.v_codes.size())) {  // int8 weight, bf16 model: attention.h
          v = kv.v_codes[p][i], w = round_to_bf16(float(prob[p]) * kv.v_scales[p]), moves = 2 * kv.v_scales[p];
        }
        o += w * v, weighted += w * std::abs(v), flips += moves * flip[p] * std::abs(v), values += std::abs(v);
      }
      r.out[h * c.d + i] = o;
      r.tolerance[h * c.d + i] = 2 * (prob_error + (n + 1 + int8) * kUlp) * weighted + flips + 1e-30 * values;
    }
  }
  return r;
}

std::vector<float> attend_all(const Case& c, const std::vector<float>& q, const KvData& kv) {
  std::vector<float> out(c.heads * c.d, NAN), scratch;
  attend(q.data(), c.heads, c.d, kv.segments, c.round_bf16, out.data(), scratch);
  return out;
}

// With each instruction set: within the tolerance of the reference, and the same bits as the first (the widest).
void expect_matches_reference(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(seed);
  const KvData kv = make_kv(c, rng);
  std::vector<float> q(c.heads * c.d);
  for (auto& x : q) x = draw_q(rng, c);
  const Reference want = reference(c, q, kv);
  std::vector<float> widest;
  test::for_each_kernel_path([&] {
    const std::vector<float> out = attend_all(c, q, kv);
    for (int64_t j = 0; j < c.heads * c.d; ++j)
      ASSERT_NEAR(out[j], want.out[j], want.tolerance[j]) << "head " << j / c.d << " dim " << j % c.d;
    if (widest.empty()) widest = out;
    ASSERT_EQ(0, std::memcmp(out.data(), widest.data(), out.size() * sizeof(float))) << "bits differ from the widest";
  });
}

// Position ranges: one row of this call only; cached rows across three blocks then a few of this call; a window
// that starts inside a block; a long run of cached rows (many blocks) and a prefill chunk.
struct Positions {
  int64_t first, cached, chunk;
};
constexpr Positions kPositions[] = {{0, 0, 1}, {0, 37, 3}, {5, 45, 1}, {3, 200, 9}};

TEST(Attention, MatchesTheDoublePrecisionReferenceOverHeadsAndHeadDims) {
  uint32_t seed = 1;
  for (int64_t heads : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16})
    for (int64_t d : {16, 24, 32, 48, 64, 80, 128, 256, 512})
      for (const Positions& p : kPositions)
        for (KvDtype cache : {KvDtype::F32, KvDtype::BF16, KvDtype::Int8})
          for (bool round_bf16 : {false, true})
            expect_matches_reference({heads, d, p.first, p.cached, p.chunk, cache, round_bf16}, seed++);
}

// E2B's prefill shape: eight query heads of one KV head over two thousand positions, head dims 256 and 512, with the
// cache of each precision and an int8 one.
TEST(Attention, MatchesTheReferenceOverALongContextAtE2bShapes) {
  for (int64_t d : {256, 512})
    for (bool bf16 : {false, true})
      for (KvDtype cache : {bf16 ? KvDtype::BF16 : KvDtype::F32, KvDtype::Int8})
        expect_matches_reference({8, d, 0, 2000, 48, cache, bf16}, static_cast<uint32_t>(d));
}

// attend_split (a decode query over a long context on every thread): attend's bits, with every instruction set, over
// the heads a pass holds and more, the head dims of E2B and others, each cache dtype, with and without rounding.
TEST(Attention, SplitAcrossThreadsGivesAttendsBits) {
  ThreadPool pool(3);
  uint32_t seed = 500;
  for (int64_t heads : {1, 3, 8, 12})
    for (int64_t d : {16, 72, 256, 512})
      for (KvDtype cache : {KvDtype::F32, KvDtype::BF16, KvDtype::Int8})
        for (bool round_bf16 : {false, true}) {
          const Case c{heads, d, 5, 700, 3, cache, round_bf16};
          SCOPED_TRACE(c.name());
          std::mt19937 rng(seed++);
          const KvData kv = make_kv(c, rng);
          std::vector<float> q(heads * d);
          for (auto& x : q) x = draw_q(rng, c);
          test::for_each_kernel_path([&] {
            std::vector<float> alone(q.size(), NAN), split(q.size(), NAN), scratch;
            attend(q.data(), heads, d, kv.segments, round_bf16, alone.data(), scratch);
            attend_split(q.data(), heads, d, kv.segments, round_bf16, split.data(), pool, scratch);
            ASSERT_EQ(0, std::memcmp(alone.data(), split.data(), alone.size() * sizeof(float)));
          });
        }
}

// The scratch buffer may come in larger than needed, or smaller, from earlier calls: results do not depend on it.
TEST(Attention, ResultsDoNotDependOnTheScratchBuffersHistory) {
  std::mt19937 rng(7);
  const Case c{8, 256, 0, 40, 2, KvDtype::BF16, true};
  const KvData kv = make_kv(c, rng);
  std::vector<float> q(c.heads * c.d);
  for (auto& x : q) x = draw_q(rng, c);
  std::vector<float> fresh_scratch, used_scratch(100000, 123.0f), first(q.size()), second(q.size());
  attend(q.data(), c.heads, c.d, kv.segments, c.round_bf16, first.data(), fresh_scratch);
  attend(q.data(), c.heads, c.d, kv.segments, c.round_bf16, second.data(), used_scratch);
  EXPECT_EQ(first, second);
}

// attend_queries: queries at a stride (a tower's patches, heads of other KV heads between them), a count that is no
// whole number of passes, each within the reference's tolerance, with the bits of attend on that query alone and
// of the widest instruction set.
TEST(Attention, ManyQueriesOverTheSameKeysMatchTheReferenceEachAlone) {
  uint32_t seed = 100;
  for (int64_t heads : {1, 2, 3, 8, 12})
    for (int64_t d : {16, 64, 72})
      for (bool round_bf16 : {false, true}) {
        const Case c{heads, d, 0, 37, 3, round_bf16 ? KvDtype::BF16 : KvDtype::F32, round_bf16};
        SCOPED_TRACE(c.name());
        std::mt19937 rng(seed++);
        const KvData kv = make_kv(c, rng);
        const int64_t queries = 11, stride = heads * d + 16;
        std::vector<float> q(queries * stride, NAN);
        for (int64_t i = 0; i < queries; ++i)
          for (int64_t j = 0; j < heads * d; ++j) q[i * stride + j] = draw_q(rng, c);
        std::vector<float> widest;
        test::for_each_kernel_path([&] {
          std::vector<float> out(queries * stride, NAN), scratch;
          attend_queries(q.data(), queries, stride, heads, d, kv.segments, round_bf16, out.data(), stride, scratch);
          for (int64_t i = 0; i < queries; ++i) {
            const std::vector<float> qi(q.begin() + i * stride, q.begin() + i * stride + heads * d);
            const Reference want = reference(c, qi, kv);
            const std::vector<float> alone = attend_all(c, qi, kv);
            for (int64_t j = 0; j < heads * d; ++j) {
              ASSERT_NEAR(out[i * stride + j], want.out[j], want.tolerance[j]) << "query " << i << " element " << j;
              ASSERT_EQ(0, std::memcmp(&out[i * stride + j], &alone[j], sizeof(float))) << "query " << i << " " << j;
            }
            for (int64_t j = heads * d; j < stride; ++j) ASSERT_TRUE(std::isnan(out[i * stride + j])) << "padding";
          }
          if (widest.empty()) widest = out;
          ASSERT_EQ(0, std::memcmp(out.data(), widest.data(), out.size() * sizeof(float))) << "bits differ from the widest";
        });
      }
}

// The softmax's own exp (attention_softmax.h) against std::exp in double: within 2 ulp over [-70, 0] (uniformly
// spread, and runs of consecutive floats), 0 below -70 and at -inf, NaN kept.
TEST(Attention, SoftmaxExpIsWithinTwoUlpOfExp) {
  using Lanes = simd::PortableLanes;
  auto exp_of = [](float x) { return attention::exp_of_shifted_score<Lanes>(Lanes::set1(x)).lane[0]; };
  std::vector<float> xs = {0.0f, -0.0f, -1e-30f, -0.5f, -0.34657359f, -0.34657362f, -69.999f, -70.0f};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> spread(-70.0f, 0.0f);
  for (int i = 0; i < (1 << 20); ++i) xs.push_back(spread(rng));
  for (float start : {-0x1p-10f, -0.34658f, -1.0f, -50.0f}) {  // runs of consecutive floats (n changes at -0.3466)
    float x = start;
    for (int i = 0; i < (1 << 18); ++i, x = std::nextafter(x, 0.0f)) xs.push_back(x);
  }
  double worst = 0;
  for (const float x : xs) {
    const double want = std::exp(double(x)), ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::abs(exp_of(x) - want) / ulp);
  }
  std::printf("[ kernels  ] softmax exp: max error %.2f ulp over %zu values in [-70, 0]\n", worst, xs.size());
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_of(-70.001f), 0.0f);
  EXPECT_EQ(exp_of(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(exp_of(NAN)));
}

// The weighted sum's pairs (attention.h): positions 2m and 2m + 1 together where listed next to each other, across
// segments too; a position whose partner is not listed beside it alone.
TEST(Attention, WeightedSumPairsPositionsByTheirParity) {
  auto segment = [](int64_t position, int64_t count) {
    KvSegment s{};
    s.position = position, s.count = count;
    return s;
  };
  // Positions 5..15, 16..31, 32..36 (a window from 5 over two cache blocks), then 37..38 (this call's rows), then
  // 40 after a gap.
  const std::vector<KvSegment> kv = {segment(5, 11), segment(16, 16), segment(32, 5), segment(37, 2),
                                     segment(40, 1)};
  std::vector<std::string> steps;
  attention::PairWalk walk(kv);
  auto at = [&](const std::optional<attention::Listed>& m) {
    return m ? std::to_string(kv[m->s].position + m->j) + "@" + std::to_string(m->p) : std::string("-");
  };
  for (attention::PairStep step; walk.next(step);)
    steps.push_back(step.run ? "run " + std::to_string(kv[step.first.s].position + step.first.j) + "+" +
                                   std::to_string(step.run) + "@" + std::to_string(step.first.p)
                             : at(step.odd) + "," + at(step.even));
  const std::vector<std::string> want = {"5@0,-",       "run 6+10@1",  "run 16+16@11", "run 32+4@27",
                                         "37@32,36@31", "-,38@33",     "-,40@34"};
  EXPECT_EQ(steps, want);
}

// The softmax on each instruction set: the portable path's bits, over rows whose lengths leave tails, scores spread
// past the negligible exponent, with and without bf16 rounding.
TEST(Attention, SoftmaxGivesTheSameBitsOnEveryInstructionSet) {
  std::mt19937 rng(11);
  for (int64_t n : {1, 15, 16, 17, 100, 1000})
    for (bool round_bf16 : {false, true}) {
      std::vector<float> scores(3 * n);
      for (auto& x : scores) x = std::normal_distribution<float>(0, 30)(rng);
      std::vector<float> want = scores;
      attention::softmax_rows(want.data(), 3, n, round_bf16);
      for (Isa isa : cpu_isas()) {
        if (isa == Isa::Portable) continue;
        std::vector<float> got = scores;
        (isa == Isa::Avx512 ? attention::softmax_avx512 : attention::softmax_avx2)(got.data(), 3, n, round_bf16);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << isa_name(isa) << " n " << n;
      }
    }
}

}  // namespace
}  // namespace qs
