// The premise of exact speculative decoding: verifying a draft of k tokens in one forward call gives, bit for bit,
// the logits that k + 1 single-token decode steps give, alone and batched beside other sequences (a decode step and a
// prompt chunk), on random tiny models of both QAT formats in f32 and bf16, with the default or an int8 KV cache,
// and with int8 activations. So greedy decoding with speculation picks exactly the tokens it picks without.
// Dropping the rejected drafts from the cache (also on sliding-window layers) leaves it as if they had never been
// computed.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"

namespace qs {
namespace {

constexpr int64_t kDraft = 5;    // draft tokens verified in one call, beside the last accepted token
constexpr int64_t kPrefix = 14;  // the verified positions span the 16-position block boundary and pass the window of 4

// `preset` as Google ships one of the two formats: the bf16 QAT checkpoint, or its int4 (w4a16) repack.
std::filesystem::path synth_in(const test::TempDir& tmp, const std::string& preset, bool int4) {
  const auto bf16 = test::synth_quietly({.preset = preset, .out = tmp / preset});
  if (!int4) return bf16;
  RepackOptions r{bf16, tmp / (preset + "-int4")};
  r.progress = false;
  repack_checkpoint(r);
  return r.dst;
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(10 + (i * 37 + salt * 13) % 4000);
  return ids;
}

void expect_same_bits(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " logits differ";
}

struct Case {
  std::string preset;
  bool int4;
  Precision precision;
  std::optional<KvDtype> kv;  // the cache's dtype; the precision's default when unset
  std::string label() const {
    return preset + (int4 ? " w4a16 " : " bf16-checkpoint ") + std::string(precision_name(precision)) +
           (kv ? " kv " + std::string(kv_dtype_name(*kv)) : "");
  }
};

std::unique_ptr<Gemma4Model> load(const test::TempDir& tmp, const Case& c) {
  auto model = Gemma4Model::load(synth_in(tmp, c.preset, c.int4), c.precision);
  if (c.kv) model->set_kv_dtype(*c.kv);
  return model;
}

void expect_verify_equals_single_steps(const Case& c) {
  test::TempDir tmp;
  auto model = load(tmp, c);
  ASSERT_EQ(model->int4_weights(), c.int4);
  const int64_t V = model->config().text.vocab_size, context = 64;
  const auto seq = tokens(kPrefix + kDraft + 1, 0);  // the prefix, the last accepted token, the draft
  const auto prefix = std::span(seq).first(kPrefix), verified = std::span(seq).subspan(kPrefix);

  // Reference: k + 1 single-token steps.
  KvCache single = model->new_cache(context);
  model->forward(prefix, single, false);
  std::vector<float> want;
  for (int32_t t : verified) {
    auto row = model->forward(std::span(&t, 1), single, false);
    want.insert(want.end(), row.begin(), row.end());
  }

  // One verification call, alone.
  KvCache alone = model->new_cache(context, kDraft);
  model->forward(prefix, alone, false);
  SequenceStep step{verified, &alone, LogitsWanted::All};
  step.tentative = kDraft;
  expect_same_bits(model->forward_batch(std::span(&step, 1)), want, c.label() + " alone");

  // And batched: beside a prompt chunk of one sequence and a decode step of another.
  KvCache spec = model->new_cache(context, kDraft), chunk = model->new_cache(context), decode = model->new_cache(context);
  model->forward(prefix, spec, false);
  const auto other = tokens(21, 1), third = tokens(9, 2);
  model->forward(std::span(other).first(20), decode, false);
  model->forward(std::span(third).first(3), chunk, false);
  SequenceStep steps[] = {{std::span(third).subspan(3), &chunk, LogitsWanted::Last},
                          {verified, &spec, LogitsWanted::All, {}, kDraft},
                          {std::span(other).subspan(20), &decode, LogitsWanted::Last}};
  auto batch = model->forward_batch(steps);
  ASSERT_EQ(batch.size(), static_cast<size_t>((kDraft + 3) * V));
  expect_same_bits(std::span(batch).subspan(V, (kDraft + 1) * V), want, c.label() + " in a batch");
  EXPECT_EQ(spec.verified(), kPrefix + 1);
}

// After rejecting drafts, the cache continues exactly as one that never saw them: decoding on from the kept
// positions gives the logits of a cache fed only the accepted tokens.
void expect_rollback_equals_never_drafted(const Case& c) {
  test::TempDir tmp;
  auto model = load(tmp, c);
  const auto accepted = tokens(kPrefix + 12, 3);
  for (int64_t kept : {int64_t{0}, int64_t{2}, kDraft}) {  // drafts accepted before the first rejection
    KvCache plain = model->new_cache(64), spec = model->new_cache(64, kDraft);
    model->forward(std::span(accepted).first(kPrefix), plain, false);
    model->forward(std::span(accepted).first(kPrefix), spec, false);
    // The draft: `kept` right tokens, then wrong ones.
    std::vector<int32_t> draft(accepted.begin() + kPrefix, accepted.begin() + kPrefix + 1 + kDraft);
    for (int64_t i = 1 + kept; i <= kDraft; ++i) draft[i] = 7 + static_cast<int32_t>(i);
    SequenceStep step{draft, &spec, LogitsWanted::All, {}, kDraft};
    model->forward_batch(std::span(&step, 1));
    spec.truncate(kPrefix + 1 + kept);
    model->forward(std::span(accepted).subspan(kPrefix, 1 + kept), plain, false);
    for (size_t t = kPrefix + 1 + kept; t < accepted.size(); ++t) {
      auto a = model->forward(std::span(accepted).subspan(t, 1), plain, false);
      auto b = model->forward(std::span(accepted).subspan(t, 1), spec, false);
      expect_same_bits(b, a, c.label() + " kept " + std::to_string(kept) + " position " + std::to_string(t));
    }
  }
}

const Case kCases[] = {
    {"e2b-tiny", false, Precision::F32},     {"e2b-tiny", false, Precision::BF16},
    {"e2b-tiny", true, Precision::F32},      {"e2b-tiny", true, Precision::BF16},
    {"26b-a4b-tiny", false, Precision::F32}, {"26b-a4b-tiny", true, Precision::BF16},
    // int8 KV (a call's own rows attended as the cache's codes and scales) and int8 activations
    {"e2b-tiny", true, Precision::F32, KvDtype::Int8},     {"e2b-tiny", true, Precision::BF16, KvDtype::Int8},
    {"26b-a4b-tiny", true, Precision::BF16, KvDtype::Int8}, {"e2b-tiny", true, Precision::Int8},
    {"e2b-tiny", true, Precision::Int8, KvDtype::Int8}};

}  // namespace

TEST(SpeculativeVerify, OneCallOverADraftEqualsSingleTokenSteps) {
  for (const Case& c : kCases) expect_verify_equals_single_steps(c);
}

TEST(SpeculativeVerify, DroppingRejectedDraftsEqualsNeverDraftingThem) {
  for (const Case& c : kCases) expect_rollback_equals_never_drafted(c);
}

}  // namespace qs
