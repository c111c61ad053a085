// Exactness at length against Hugging Face transformers: the fixtures' tiny models (windows of 8 tokens) over 4096
// positions (tools/python/make_long_goldens.py: transformers' f32 logits at every 128th position and the last 4).
// Each sliding window is crossed ~500 times, proportional RoPE reaches position 4095, KV-shared layers read their
// donors at that depth. Checked in f32 as the short goldens are (5e-6 of each position's peak |logit|):
//   - a paged prefill in chunks that share no period with the window or the blocks (blocks of 16, chunks of 100);
//   - a prefix-cache reuse mid-window: a second sequence adopts the first's blocks (of 3 positions: block edges
//     fall inside windows) up to position 2049 and computes the rest;
//   - preemption at depth: the engine scores the 4096 tokens beside an older sequence in a pool too small for both,
//     sends the scoring one back mid-prefill, recomputes it, and its prompt scores are transformers' log-softmax;
// and the error of a bf16 and an int8 KV cache (f32 activations) against the same reference, printed side by side
// and bounded; then deeper references, 8192 to 131072 positions (LongContextDeep below). ctest label `long` (the
// README's test command runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "engine/engine.h"
#include "formats/safetensors.h"
#include "model/gemma4.h"
#include "test_util.h"

namespace qs {
namespace {

const std::string kFixtures = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/";
constexpr float kF32RelativeTolerance = 5e-6f;

struct LongReference {
  std::vector<int32_t> tokens, positions;
  std::vector<float> logits;
  int64_t vocab = 0;
};

LongReference load_long_reference(const std::string& fixture, const std::string& file = "long_reference.safetensors") {
  SafetensorsFile f = SafetensorsFile::open(kFixtures + fixture + "/" + file);
  LongReference r{test::read_tensor<int32_t>(f, "tokens"), test::read_tensor<int32_t>(f, "positions"),
                  test::read_tensor<float>(f, "logits_f32")};
  r.vocab = f.find("logits_f32")->shape[1];
  return r;
}

// Runs tokens [from, to) through `cache` in chunks of `chunk`; keeps the logits of the reference's positions.
void run_into(const Gemma4Model& model, KvCache& cache, const LongReference& r, int64_t from, int64_t to,
              int64_t chunk, std::vector<float>& kept) {
  kept.resize(r.positions.size() * r.vocab);
  for (int64_t at = from; at < to; at += chunk) {
    const int64_t n = std::min(chunk, to - at);
    const std::vector<float> logits = model.forward(std::span(r.tokens).subspan(at, n), cache, true);
    for (size_t i = 0; i < r.positions.size(); ++i)
      if (r.positions[i] >= at && r.positions[i] < at + n)
        std::copy_n(logits.begin() + (r.positions[i] - at) * r.vocab, r.vocab, kept.begin() + i * r.vocab);
  }
}

// max |ours - reference| / peak |reference| at each kept position at or after `from`.
std::vector<float> relative_errors(const LongReference& r, const std::vector<float>& ours, int64_t from) {
  std::vector<float> errors;
  for (size_t i = 0; i < r.positions.size(); ++i) {
    if (r.positions[i] < from) continue;
    const float* ref = r.logits.data() + i * r.vocab;
    float diff = 0, peak = 0;
    for (int64_t v = 0; v < r.vocab; ++v)
      diff = std::max(diff, std::fabs(ours[i * r.vocab + v] - ref[v])), peak = std::max(peak, std::fabs(ref[v]));
    errors.push_back(diff / peak);
  }
  return errors;
}

// The worst of relative_errors.
float worst_relative(const LongReference& r, const std::vector<float>& ours, int64_t from) {
  const std::vector<float> errors = relative_errors(r, ours, from);
  return errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());
}

std::shared_ptr<KvPool> pool_of(const Gemma4Model& model, int64_t block_size, int64_t sequences, int64_t context) {
  KvLayout layout = model.kv_layout(block_size);
  return std::make_shared<KvPool>(layout, kv_pool_for_sequences(layout, sequences, context));
}

class LongContext : public ::testing::TestWithParam<std::string> {};

TEST_P(LongContext, ChunkedPrefillMatchesTransformersAt4096) {
  const LongReference r = load_long_reference(GetParam());
  const int64_t T = static_cast<int64_t>(r.tokens.size());
  auto model = Gemma4Model::load(kFixtures + GetParam() + "/bf16", Precision::F32);
  KvCache cache(pool_of(*model, 16, 1, T), T);
  std::vector<float> ours;
  run_into(*model, cache, r, 0, T, 100, ours);
  const float worst = worst_relative(r, ours, 0);
  EXPECT_LE(worst, kF32RelativeTolerance);
  std::printf("[ long     ] %s f32, %lld positions in chunks of 100: max |ours - transformers| / peak = %.3g\n",
              GetParam().c_str(), static_cast<long long>(T), worst);
}

TEST_P(LongContext, PrefixReuseMidWindowMatchesTransformers) {
  const LongReference r = load_long_reference(GetParam());
  const int64_t T = static_cast<int64_t>(r.tokens.size()), shared = 2049;
  auto model = Gemma4Model::load(kFixtures + GetParam() + "/bf16", Precision::F32);
  auto pool = pool_of(*model, 3, 2, T);
  std::vector<float> ignored, ours;
  {
    KvCache first(pool, T);
    run_into(*model, first, r, 0, shared, 256, ignored);
  }
  KvCache second(pool, T);
  const int64_t adopted = second.adopt_prefix(r.tokens);
  EXPECT_EQ(adopted, shared / 3 * 3);  // every complete block of the first sequence
  run_into(*model, second, r, adopted, T, 256, ours);
  const float worst = worst_relative(r, ours, adopted);
  EXPECT_LE(worst, kF32RelativeTolerance);
  std::printf("[ long     ] %s f32, %lld positions adopted (blocks of 3, window 8), the rest computed: max "
              "|ours - transformers| / peak = %.3g\n", GetParam().c_str(), static_cast<long long>(adopted), worst);
}

// What one engine request gets: its prompt scores and its end.
struct Finished {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<SampledToken> prompt_scores;
  bool done = false;

  EventSink sink() {
    return [this](EngineEvent&& e) {
      std::lock_guard lock(mu);
      if (!e.prompt_logprobs.empty()) prompt_scores = std::move(e.prompt_logprobs);
      if (e.finished) done = true, cv.notify_all();
      return true;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

// log-softmax of the reference's logits at kept position i, for token `id`, and the row's peak |logit|.
std::pair<double, float> reference_logprob(const LongReference& r, size_t i, int32_t id) {
  const float* row = r.logits.data() + i * r.vocab;
  double max = row[0], sum = 0;
  float peak = 0;
  for (int64_t v = 0; v < r.vocab; ++v) max = std::max<double>(max, row[v]), peak = std::max(peak, std::fabs(row[v]));
  for (int64_t v = 0; v < r.vocab; ++v) sum += std::exp(row[v] - max);
  return {row[id] - max - std::log(sum), peak};
}

TEST_P(LongContext, PreemptedAtDepthScoresAsTransformers) {
  const LongReference r = load_long_reference(GetParam());
  const int64_t T = static_cast<int64_t>(r.tokens.size()), block = 16;
  auto model = Gemma4Model::load(kFixtures + GetParam() + "/bf16", Precision::F32);
  // Full-attention room for 1.25 sequences of T beside the sliding layers' windows: the older sequence (1536 prompt
  // tokens, then decoding) and the scoring one (T) cannot both finish, so the younger, scoring one is sent back.
  const KvLayout layout = model->kv_layout(block);
  const uint64_t bytes = (T + T / 4) / block * layout.block_bytes(KvClass::Full) +
                         2 * layout.sliding_blocks_cap() * layout.block_bytes(KvClass::Sliding);
  Engine engine(*model, nullptr, GenerationConfig{},
                {.max_running = 2, .prefill_chunk = 256, .max_context = T, .kv_bytes = bytes, .kv_block_size = block});
  EngineRequest older, scoring;
  older.prompt.assign(r.tokens.begin(), r.tokens.begin() + 1536);
  older.max_tokens = 128, older.ignore_eos = true, older.sampling.temperature = 0;
  scoring.prompt.assign(r.tokens.begin(), r.tokens.end());
  scoring.max_tokens = 0, scoring.prompt_logprobs = 0;
  Finished a, b;
  ASSERT_EQ(engine.submit(older, a.sink()).status, SubmitStatus::Accepted);
  ASSERT_EQ(engine.submit(scoring, b.sink()).status, SubmitStatus::Accepted);
  a.wait();
  b.wait();
  EXPECT_GT(engine.stats().preemptions, 0u);
  ASSERT_EQ(static_cast<int64_t>(b.prompt_scores.size()), T - 1);
  double worst = 0;  // |ours - transformers| / peak |logit|; a log-softmax moves by at most twice a logit's error
  for (size_t i = 0; i < r.positions.size(); ++i) {
    const int32_t p = r.positions[i];
    if (p + 1 >= T) continue;
    const auto [want, peak] = reference_logprob(r, i, r.tokens[p + 1]);
    ASSERT_EQ(b.prompt_scores[p].id, r.tokens[p + 1]);
    worst = std::max(worst, std::fabs(b.prompt_scores[p].logprob - want) / peak);
  }
  EXPECT_LE(worst, 2 * kF32RelativeTolerance);
  std::printf("[ long     ] %s f32, %lld positions scored through %llu preemption(s): max |ours - transformers| "
              "log-softmax / peak = %.3g\n", GetParam().c_str(), static_cast<long long>(T),
              static_cast<unsigned long long>(engine.stats().preemptions), worst);
}

// The lossy and the lossless compressed caches at depth, against the f32 reference: bf16 K/V are what a bf16 model
// stores anyway; int8's error (codes and a scale per position and head) is bounded and printed beside bf16's.
TEST_P(LongContext, Int8KvErrorBesideBf16AtDepth) {
  const LongReference r = load_long_reference(GetParam());
  const int64_t T = static_cast<int64_t>(r.tokens.size());
  float error[2];
  const KvDtype dtypes[2] = {KvDtype::BF16, KvDtype::Int8};
  for (int i = 0; i < 2; ++i) {
    auto model = Gemma4Model::load(kFixtures + GetParam() + "/bf16", Precision::F32);
    model->set_kv_dtype(dtypes[i]);
    KvCache cache(pool_of(*model, 16, 1, T), T);
    std::vector<float> ours;
    run_into(*model, cache, r, 0, T, 256, ours);
    error[i] = worst_relative(r, ours, 0);
  }
  std::printf("[ long     ] %s at %lld positions, f32 activations: max |ours - transformers| / peak, bf16 KV %.3g, "
              "int8 KV %.3g\n", GetParam().c_str(), static_cast<long long>(T), error[0], error[1]);
  // Measured (f32 activations, 4096 positions): bf16 KV 0.0044 / 0.025 / 0.00097 of the peak |logit| on e2b_like /
  // moe_like / qat_head, int8 KV 0.024 / 0.25 / 0.0041. moe_like's worst positions are where a KV rounding flips a
  // top-2 expert choice (its router sees the attention output), which no KV format avoids; the bounds hold what
  // was measured with room for another CPU's summation order.
  EXPECT_LE(error[0], 0.05f);
  EXPECT_LE(error[1], 0.35f);
}

// Deeper references (transformers ran them in chunks of 2048 through its own cache, which agrees with its one-pass
// logits within 2.4e-6 of the peak at 4096): the MoE and dense fixtures at 8192 positions, the KV-shared one at 32768
// (each window crossed ~4000 times, the donors' caches read 32K deep) and long_like, a one-head model of E2B's
// features, at 131072, its max_position_embeddings (proportional RoPE at position 131071, where an angle computed
// another way than transformers' f32 product would be off by ~1e-2 radians). Prefill in chunks of 500. Bound: twice
// the f32 tolerance, as the reference's own chunking moves it by half that. Measured (AVX2): 1.2e-6 / 7.9e-7 /
// 4.5e-6 / 4.6e-6; long_like takes ~500 s of CPU, e2b_like ~60 s.
// Where `kv_dtypes`, the bf16 and int8 caches' errors at that depth are printed beside each other: the median and the
// worst position. On moe_like one or two of the 35 positions are far worse than the rest (bf16 KV: 0.48 and 0.085 of
// the peak where the median is 0.0018), as a rounding that changes a top-2 expert choice makes them (the router sees
// the attention output), so there only the median is bounded.
struct DeepReference {
  std::string fixture, file;
  int64_t positions;
  bool kv_dtypes, routed;  // routed: the model has MoE experts
};

void PrintTo(const DeepReference& d, std::ostream* os) { *os << d.fixture << "@" << d.positions; }

float median(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

class LongContextDeep : public ::testing::TestWithParam<DeepReference> {};

TEST_P(LongContextDeep, ChunkedPrefillMatchesTransformers) {
  const DeepReference& d = GetParam();
  const LongReference r = load_long_reference(d.fixture, d.file);
  const int64_t T = static_cast<int64_t>(r.tokens.size());
  ASSERT_EQ(T, d.positions);
  std::vector<KvDtype> dtypes{KvDtype::F32};
  if (d.kv_dtypes) dtypes.insert(dtypes.end(), {KvDtype::BF16, KvDtype::Int8});
  std::vector<std::vector<float>> errors;  // per dtype, per kept position
  for (const KvDtype dtype : dtypes) {
    auto model = Gemma4Model::load(kFixtures + d.fixture + "/bf16", Precision::F32);
    model->set_kv_dtype(dtype);
    KvCache cache(pool_of(*model, 16, 1, T), T);
    std::vector<float> ours;
    run_into(*model, cache, r, 0, T, 500, ours);
    errors.push_back(relative_errors(r, ours, 0));
  }
  const auto worst = [](const std::vector<float>& e) { return *std::max_element(e.begin(), e.end()); };
  std::printf("[ long     ] %s f32, %lld positions in chunks of 500: max |ours - transformers| / peak = %.3g\n",
              d.fixture.c_str(), static_cast<long long>(T), worst(errors[0]));
  EXPECT_LE(worst(errors[0]), 2 * kF32RelativeTolerance);
  if (!d.kv_dtypes) return;
  std::printf("[ long     ] %s at %lld positions, f32 activations, |ours - transformers| / peak: bf16 KV median %.3g "
              "worst %.3g, int8 KV median %.3g worst %.3g\n", d.fixture.c_str(), static_cast<long long>(T),
              median(errors[1]), worst(errors[1]), median(errors[2]), worst(errors[2]));
  // Measured: moe_like median bf16 0.0018 / int8 0.0054, qat_head worst 0.0013 / 0.0036.
  EXPECT_LE(median(errors[1]), 0.005f);
  EXPECT_LE(median(errors[2]), 0.02f);
  if (d.routed) return;
  EXPECT_LE(worst(errors[1]), 0.05f);
  EXPECT_LE(worst(errors[2]), 0.35f);
}

INSTANTIATE_TEST_SUITE_P(References, LongContextDeep,
                         ::testing::Values(DeepReference{"moe_like", "long_reference_8k.safetensors", 8192, true, true},
                                           DeepReference{"qat_head", "long_reference_8k.safetensors", 8192, true, false},
                                           DeepReference{"e2b_like", "long_reference_32k.safetensors", 32768, false, false},
                                           DeepReference{"long_like", "long_reference_128k.safetensors", 131072,
                                                         false, false}));

INSTANTIATE_TEST_SUITE_P(Fixtures, LongContext, ::testing::Values("e2b_like", "moe_like", "qat_head"));

}  // namespace
}  // namespace qs
