// The paged KV cache against itself unpaged: blocks of 3 positions give exactly the logits of one block per
// sequence (prompts past the sliding window, chunks across block boundaries); sliding layers hold at most their
// window's blocks; a prefix-cache hit gives exactly the logits of computing the prefix; eviction stays correct.
// Speculative drafts: tentative positions are never published, dropping them (on small blocks, past the sliding
// window) leaves exactly the cache that never held them, and the misuse of either is a clear error.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

std::unique_ptr<Gemma4Model> tiny_model(const test::TempDir& tmp, const std::string& preset, Precision precision) {
  return Gemma4Model::load(test::synth_quietly({.preset = preset, .out = tmp / preset}), precision);
}

std::vector<int32_t> prompt(int n, int salt = 0) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(10 + (i * 37 + salt * 11) % 4000);
  return ids;
}

std::shared_ptr<KvPool> pool_for(const Gemma4Model& model, int64_t block_size, int64_t sequences, int64_t context,
                                 int64_t max_tentative = 0) {
  KvLayout layout = model.kv_layout(block_size);
  layout.max_tentative = max_tentative;
  const KvPoolSize size = kv_pool_for_sequences(layout, sequences, context);
  return std::make_shared<KvPool>(std::move(layout), size);
}

// Feeds `ids` in the given chunk sizes; returns every chunk's last logits, one after another.
std::vector<float> run_chunks(const Gemma4Model& model, KvCache& cache, std::span<const int32_t> ids,
                              const std::vector<int64_t>& chunks) {
  std::vector<float> out;
  size_t at = 0;
  for (int64_t n : chunks) {
    auto logits = model.forward(ids.subspan(at, n), cache, false);
    out.insert(out.end(), logits.begin(), logits.end());
    at += n;
  }
  EXPECT_EQ(at, ids.size());
  return out;
}

}  // namespace

TEST(KvCache, PagedEqualsContiguous) {
  const std::vector<int64_t> chunks = {5, 1, 7, 1, 1, 8, 1, 2};  // 26 positions; the tiny window is 4
  for (auto [preset, precision] : {std::pair{"e2b-tiny", Precision::F32}, std::pair{"e2b-tiny", Precision::BF16},
                                   std::pair{"26b-a4b-tiny", Precision::BF16}}) {
    test::TempDir tmp;
    auto model = tiny_model(tmp, preset, precision);
    auto ids = prompt(26);
    KvCache contiguous(pool_for(*model, 64, 1, 64), 64);  // one block per layer class: no paging
    KvCache paged(pool_for(*model, 3, 1, 64), 64);
    EXPECT_EQ(run_chunks(*model, paged, ids, chunks), run_chunks(*model, contiguous, ids, chunks)) << preset;
  }
}

TEST(KvCache, StoresBf16ForBf16Activations) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::BF16);
  EXPECT_EQ(model->kv_layout().dtype, KvDtype::BF16);
  EXPECT_EQ(model->kv_layout().row_bytes(KvClass::Full), 2u * model->kv_layout().row[0]);
  auto f32 = Gemma4Model::load(tmp / "e2b-tiny", Precision::F32);
  EXPECT_EQ(f32->kv_layout().dtype, KvDtype::F32);
  EXPECT_EQ(f32->new_cache(40).capacity_bytes(), 2 * model->new_cache(40).capacity_bytes());
}

TEST(KvCache, SlidingLayersNeverHoldMoreThanTheirWindow) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  const int64_t bs = 2;
  auto pool = pool_for(*model, bs, 1, 64);
  const KvLayout& layout = pool->layout();
  ASSERT_GT(layout.layers[size_t(KvClass::Sliding)], 0);
  ASSERT_GT(layout.layers[size_t(KvClass::Full)], 0);
  const int64_t window_blocks = (layout.window - 1 + bs - 1) / bs + 1;
  KvCache cache(pool, 64);
  auto ids = prompt(40);
  int64_t at = 0;
  for (int64_t n : {9, 1, 1, 5, 1, 1, 1, 12, 1, 8}) {
    model->forward(std::span(ids).subspan(at, n), cache, false);
    at += n;
    EXPECT_LE(cache.blocks_held(KvClass::Sliding), window_blocks) << "at " << at;
    EXPECT_EQ(cache.blocks_held(KvClass::Full), (at + bs - 1) / bs) << "at " << at;
    EXPECT_EQ(pool->blocks_used(), cache.blocks_held(KvClass::Sliding) + cache.blocks_held(KvClass::Full));
  }
}

// With int8 KV too: a fresh prefill attends its own rows as the cache's codes and scales, so a hit is bit-identical.
TEST(KvCache, PrefixCacheHitGivesTheSameLogits) {
  for (auto [precision, kv] : {std::pair{Precision::F32, KvDtype::F32}, std::pair{Precision::BF16, KvDtype::BF16},
                               std::pair{Precision::F32, KvDtype::Int8}, std::pair{Precision::BF16, KvDtype::Int8}}) {
    SCOPED_TRACE(std::string(precision_name(precision)) + " activations, " + std::string(kv_dtype_name(kv)) + " KV");
    test::TempDir tmp;
    auto model = tiny_model(tmp, "e2b-tiny", precision);
    model->set_kv_dtype(kv);
    auto pool = pool_for(*model, 4, 8, 64);
    auto ids = prompt(30);
    std::vector<float> computed;
    {
      // Chunks no longer than the window store every position's sliding K/V (as the real models' 512-token
      // window with the engine's 256-token chunks does), so shorter shared prefixes hit too.
      KvCache first(pool, 64);
      const std::vector<int64_t> chunks = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
      const auto all = run_chunks(*model, first, ids, chunks);
      const int64_t V = model->config().text.vocab_size;
      computed.assign(all.end() - V, all.end());
      KvCache second(pool, 64);  // while the first still holds the blocks
      EXPECT_EQ(second.adopt_prefix(ids), 28);  // 7 complete blocks; the last token is always computed
      EXPECT_EQ(model->forward(std::span(ids).subspan(28), second, false), computed);
    }
    KvCache third(pool, 64);  // nobody holds them now: cached, not freed
    EXPECT_EQ(third.adopt_prefix(ids), 28);
    EXPECT_EQ(model->forward(std::span(ids).subspan(28), third, false), computed);

    auto other = ids;
    other[10] = 7;  // shares the first two blocks only
    KvCache fourth(pool, 64);
    EXPECT_EQ(fourth.adopt_prefix(other), 8);
    KvCache fresh(pool_for(*model, 4, 1, 64), 64);
    EXPECT_EQ(model->forward(std::span(other).subspan(8), fourth, false), model->forward(other, fresh, false));
  }
}

// A salted cache (a LoRA adapter's sequences: engine.cc) shares blocks only with caches of the same salt.
TEST(KvCache, PrefixSaltsKeepSequencesApart) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  auto pool = pool_for(*model, 4, 8, 64);
  const auto ids = prompt(30);
  const std::vector<int64_t> chunks = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
  auto cache = [&](uint64_t salt) {
    KvCache c(pool, 64);
    if (salt) c.set_prefix_salt(salt);
    return c;
  };
  {
    KvCache base = cache(0);
    run_chunks(*model, base, ids, chunks);
    KvCache adapter = cache(7);
    EXPECT_EQ(adapter.adopt_prefix(ids), 0) << "an adapter's sequence adopted the base's K/V";
    run_chunks(*model, adapter, ids, chunks);
  }
  KvCache same = cache(7), other = cache(8), plain = cache(0);
  EXPECT_EQ(same.adopt_prefix(ids), 28);
  EXPECT_EQ(other.adopt_prefix(ids), 0) << "another adapter's sequence adopted this one's K/V";
  EXPECT_EQ(plain.adopt_prefix(ids), 28);
}

TEST(KvCache, EvictedBlocksAreRecomputedCorrectly) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  auto pool = pool_for(*model, 4, 1, 32);  // room for one sequence: each new one evicts the last one's blocks
  auto a = prompt(30, 1), b = prompt(30, 2);
  std::vector<float> want_a;
  {
    KvCache cache(pool, 32);
    want_a = model->forward(a, cache, false);
  }
  {
    KvCache cache(pool, 32);
    EXPECT_EQ(cache.adopt_prefix(b), 0);
    model->forward(b, cache, false);
  }
  EXPECT_EQ(pool->blocks_used(), 0);
  KvCache again(pool, 32);
  const int64_t adopted = again.adopt_prefix(a);
  EXPECT_LT(adopted, 28);  // b's blocks took most of a's
  EXPECT_EQ(model->forward(std::span(a).subspan(adopted), again, false), want_a);
}

TEST(KvCache, ACacheCopyIsIndependent) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::BF16);
  auto ids = prompt(20);
  KvCache base = model->new_cache(32);
  model->forward(std::span(ids).first(13), base, false);
  KvCache copy = base;
  auto from_base = model->forward(std::span(ids).subspan(13), base, false);
  EXPECT_EQ(model->forward(std::span(ids).subspan(13), copy, false), from_base);
}

TEST(KvCache, AFullPoolIsAClearError) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  auto pool = pool_for(*model, 4, 1, 16);
  KvCache holder(pool, 64);
  model->forward(prompt(12), holder, false);
  KvCache other(pool, 64);
  try {
    model->forward(prompt(12), other, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the KV pool has 1 free blocks of 4 positions for the full-attention layers"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(other.length(), 0);
}

TEST(KvCache, BudgetSplitsWindowsAndGrowingLayers) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::BF16);
  const KvLayout layout = model->kv_layout(16);
  const uint64_t full = layout.block_bytes(KvClass::Full), sliding = layout.block_bytes(KvClass::Sliding);
  // Plenty: sliding layers get 4 sequences' windows, full layers the rest.
  const int64_t windows = 4 * layout.max_blocks_held(KvClass::Sliding, 1000);
  KvPoolSize big = kv_pool_for_budget(layout, 100 * full + windows * sliding, 4, 1000);
  EXPECT_EQ(big.blocks[size_t(KvClass::Sliding)], windows);
  EXPECT_EQ(big.blocks[size_t(KvClass::Full)], 100);
  // Short: sliding layers never take more than half.
  KvPoolSize small = kv_pool_for_budget(layout, 4 * sliding, 100, 1000);
  EXPECT_LE(small.blocks[size_t(KvClass::Sliding)] * sliding, 2 * sliding);
}

namespace {

// Appends `tokens` to `cache` as a verification step: the last `tentative` of them drafts.
void verify_step(const Gemma4Model& model, KvCache& cache, std::span<const int32_t> tokens, int64_t tentative) {
  SequenceStep step{tokens, &cache, LogitsWanted::All, {}, tentative};
  model.forward_batch(std::span(&step, 1));
}

}  // namespace

TEST(KvCache, TentativePositionsAreNeverPublished) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  auto pool = pool_for(*model, 4, 4, 64, 6);
  auto ids = prompt(20);
  KvCache spec(pool, 64);
  model->forward(std::span(ids).first(6), spec, false);
  verify_step(*model, spec, std::span(ids).subspan(6, 7), 6);  // positions 7..12 tentative: blocks 1 and 2 complete
  EXPECT_EQ(spec.length(), 13);
  EXPECT_EQ(spec.verified(), 7);
  KvCache probe(pool, 64);
  EXPECT_EQ(probe.adopt_prefix(ids), 4) << "only block 0 holds verified positions alone";
  probe = KvCache(pool, 64);
  spec.truncate(10);  // 3 drafts accepted: block 1 (4..7) is verified now, block 2 is not complete
  EXPECT_EQ(spec.length(), 10);
  EXPECT_EQ(spec.verified(), 10);
  EXPECT_EQ(probe.adopt_prefix(ids), 8);
}

TEST(KvCache, DroppedDraftsOnSmallBlocksLeaveTheCacheThatNeverHeldThem) {
  for (Precision precision : {Precision::F32, Precision::BF16}) {
    test::TempDir tmp;
    auto model = tiny_model(tmp, "e2b-tiny", precision);  // sliding window 4, blocks of 3: the window's blocks turn over
    const int64_t k = 5;
    auto pool = pool_for(*model, 3, 2, 64, k);
    auto ids = prompt(40);
    KvCache plain(pool_for(*model, 3, 1, 64), 64), spec(pool, 64);
    model->forward(std::span(ids).first(8), plain, false);
    model->forward(std::span(ids).first(8), spec, false);
    int64_t at = 8;
    for (int64_t accepted : {0, 5, 2, 1, 4, 0, 3}) {
      std::vector<int32_t> step(ids.begin() + at, ids.begin() + at + 1 + k);
      for (int64_t i = 1 + accepted; i <= k; ++i) step[i] = 3 + static_cast<int32_t>(i);  // rejected drafts
      verify_step(*model, spec, step, k);
      EXPECT_LE(spec.blocks_held(KvClass::Sliding), pool->layout().sliding_blocks_cap());
      spec.truncate(at + 1 + accepted);
      model->forward(std::span(ids).subspan(at, 1 + accepted), plain, false);
      at += 1 + accepted;
      EXPECT_EQ(model->forward(std::span(ids).subspan(at, 1), spec, false),
                model->forward(std::span(ids).subspan(at, 1), plain, false))
          << "after keeping " << accepted << " drafts, position " << at;
      ++at;
    }
    EXPECT_EQ(pool->blocks_used(), spec.blocks_held(KvClass::Sliding) + spec.blocks_held(KvClass::Full));
  }
}

TEST(KvCache, MisusedDraftsAreClearErrors) {
  test::TempDir tmp;
  auto model = tiny_model(tmp, "e2b-tiny", Precision::F32);
  auto ids = prompt(20);
  KvCache cache(pool_for(*model, 4, 1, 64, 3), 64);
  model->forward(std::span(ids).first(5), cache, false);
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { verify_step(*model, cache, std::span(ids).subspan(5, 5), 4); }).find("room for 3"),
            std::string::npos);
  verify_step(*model, cache, std::span(ids).subspan(5, 3), 2);
  EXPECT_NE(message([&] { model->forward(std::span(ids).subspan(8, 1), cache, false); })
                .find("verified positions cannot follow tentative ones"),
            std::string::npos);
  EXPECT_NE(message([&] { cache.truncate(5); }).find("the first 6 are verified"), std::string::npos);
  cache.truncate(7);
  EXPECT_EQ(cache.length(), 7);
}

}  // namespace qs
