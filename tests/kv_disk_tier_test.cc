// The prefix cache's disk tier (model/kv_disk_tier.h): a prefix computed by one pool, written when its blocks leave
// RAM (evicted, or the pool destroyed as at a server's exit), is adopted by a later pool over the same directory
// and gives exactly the logits of computing it (f32, bf16 and int8 KV); corrupt, truncated and foreign files are
// never used (a warning each); a bound too small for a block and a directory that cannot be written never break
// the cache, only its disk tier.
#include "model/kv_disk_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/file.h"

namespace qs {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> prompt(int n, int salt = 0) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(10 + (i * 37 + salt * 11) % 4000);
  return ids;
}

struct Tier {
  fs::path dir;
  uint64_t max_bytes = 1ull << 30;
  std::vector<std::string> warnings;

  std::unique_ptr<KvDiskTier> open(uint64_t identity = 7) {
    return std::make_unique<KvDiskTier>(
        DiskTierOptions{dir, max_bytes, identity, 0, [this](const std::string& w) { warnings.push_back(w); }});
  }
};

// A pool of blocks of 4 positions for `sequences` contexts of 32, spilling to `tier`.
std::shared_ptr<KvPool> pool_with(const Gemma4Model& model, Tier& tier, int64_t sequences, uint64_t identity = 7) {
  KvLayout layout = model.kv_layout(4);
  auto pool = std::make_shared<KvPool>(layout, kv_pool_for_sequences(layout, sequences, 32));
  pool->attach_disk(tier.open(identity));
  return pool;
}

std::vector<float> fresh_logits(const Gemma4Model& model, std::span<const int32_t> ids) {
  KvCache fresh = model.new_cache(32);
  return model.forward(ids, fresh, false);
}

std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".kvb") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

class KvDiskTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<Gemma4Model> model(Precision precision, KvDtype kv) {
    if (!fs::exists(tmp_ / "m")) test::synth_quietly({.preset = "e2b-tiny", .out = tmp_ / "m"});
    auto m = Gemma4Model::load(tmp_ / "m", precision);
    m->set_kv_dtype(kv);
    return m;
  }
  test::TempDir tmp_;
};

// A "restart": the first pool is destroyed with the prompt's blocks cached (written out then); a new pool over the
// same directory adopts them from disk, and the rest of the prompt gives a fresh prefill's logits exactly.
TEST_F(KvDiskTierTest, ARestartedPoolAdoptsThePrefixFromDiskWithTheSameLogits) {
  for (auto [precision, kv] : {std::pair{Precision::F32, KvDtype::F32}, std::pair{Precision::BF16, KvDtype::BF16},
                               std::pair{Precision::BF16, KvDtype::Int8}}) {
    SCOPED_TRACE(std::string(precision_name(precision)) + " activations, " + std::string(kv_dtype_name(kv)) + " KV");
    auto m = model(precision, kv);
    Tier tier{tmp_ / ("cache-" + std::string(kv_dtype_name(kv)))};
    const auto ids = prompt(30);
    const auto want = fresh_logits(*m, ids);
    {
      auto pool = pool_with(*m, tier, 2);
      KvCache first(pool, 32);
      m->forward(ids, first, false);
    }  // cache, then pool destroyed: the 7 complete blocks of both classes written
    EXPECT_FALSE(block_files(tier.dir).empty());
    auto pool = pool_with(*m, tier, 2);
    KvCache again(pool, 32);
    EXPECT_EQ(again.adopt_prefix(ids), 28);
    EXPECT_EQ(again.adopted_from_disk(), 28);
    EXPECT_EQ(m->forward(std::span(ids).subspan(28), again, false), want);
    EXPECT_GT(pool->disk()->stats().loaded, 0u);
    EXPECT_TRUE(tier.warnings.empty()) << tier.warnings.front();

    KvCache ram(pool, 32);  // read back once, the blocks are in RAM again
    EXPECT_EQ(ram.adopt_prefix(ids), 28);
    EXPECT_EQ(ram.adopted_from_disk(), 0);
  }
}

// A pool with room for one sequence: the next prompt evicts the first's blocks, which go to disk and come back.
TEST_F(KvDiskTierTest, EvictedBlocksComeBackFromDisk) {
  auto m = model(Precision::F32, KvDtype::F32);
  Tier tier{tmp_ / "cache"};
  auto pool = pool_with(*m, tier, 1);
  const auto a = prompt(30, 1), b = prompt(30, 2);
  const auto want = fresh_logits(*m, a);
  {
    KvCache cache(pool, 32);
    m->forward(a, cache, false);
  }
  {
    KvCache cache(pool, 32);
    m->forward(b, cache, false);
  }
  EXPECT_GT(pool->disk()->stats().stored, 0u);
  KvCache again(pool, 32);
  EXPECT_EQ(again.adopt_prefix(a), 28);
  EXPECT_GT(again.adopted_from_disk(), 0);
  EXPECT_EQ(m->forward(std::span(a).subspan(28), again, false), want);
}

// Files damaged three ways: each is refused with a warning naming it and removed, and the prefix stops short of
// it (what is adopted still gives the fresh logits).
TEST_F(KvDiskTierTest, CorruptTruncatedAndForeignFilesAreNeverUsed) {
  auto m = model(Precision::F32, KvDtype::F32);
  const auto ids = prompt(30);
  const auto want = fresh_logits(*m, ids);
  for (const std::string damage : {"flipped byte", "truncated", "foreign", "another model"}) {
    SCOPED_TRACE(damage);
    Tier tier{tmp_ / ("cache-" + damage)};
    {
      auto pool = pool_with(*m, tier, 2);
      KvCache first(pool, 32);
      m->forward(ids, first, false);
    }
    auto files = block_files(tier.dir);
    ASSERT_GE(files.size(), 4u);
    // Full-attention blocks are named <key>-0, and every one of the prompt's is read when its chain is walked:
    // damage one (wherever it lies in the chain, the prefix stops short of it and still computes exactly).
    const fs::path victim = *std::find_if(files.begin(), files.end(),
                                          [](const fs::path& f) { return f.stem().string().ends_with("-0"); });
    std::string bytes = read_file(victim);
    if (damage == "flipped byte") bytes[bytes.size() / 2] ^= 0x10;
    if (damage == "truncated") bytes.resize(bytes.size() - 9);
    if (damage == "foreign") bytes = read_file(victim == files[0] ? files[1] : files[0]);  // another block's file
    if (damage == "another model") bytes[8 + 4 + 4] ^= 1;  // the identity field, checksum fixed up below
    if (damage == "another model") {
      const uint64_t sum = hash_bytes(std::as_bytes(std::span(bytes.data(), bytes.size() - 8)));
      std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    }
    std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;

    auto pool = pool_with(*m, tier, 2);
    KvCache again(pool, 32);
    const int64_t adopted = again.adopt_prefix(ids);
    EXPECT_LT(adopted, 28);
    EXPECT_EQ(m->forward(std::span(ids).subspan(adopted), again, false), want);
    ASSERT_EQ(tier.warnings.size(), 1u);
    EXPECT_NE(tier.warnings[0].find(victim.filename().string()), std::string::npos) << tier.warnings[0];
    EXPECT_EQ(pool->disk()->stats().rejected, 1u);
    EXPECT_FALSE(fs::exists(victim));
  }
}

// A bound smaller than one block's file, and a directory that vanished under the tier (writes fail): the RAM cache
// serves as before, the disk tier counts and warns.
TEST_F(KvDiskTierTest, AFullOrFailingDiskNeverBreaksTheCache) {
  auto m = model(Precision::F32, KvDtype::F32);
  const auto a = prompt(30, 1), b = prompt(30, 2);
  const auto want = fresh_logits(*m, a);
  for (const std::string how : {"tiny bound", "failing write"}) {
    SCOPED_TRACE(how);
    Tier tier{tmp_ / ("cache-" + how), how == "tiny bound" ? 100u : 1ull << 30};
    auto pool = pool_with(*m, tier, 1);
    if (how == "failing write") {  // the identity folder replaced by a file: every write fails
      const fs::path folder = pool->disk()->directory();
      fs::remove_all(folder);
      std::ofstream(folder) << "not a directory";
    }
    for (const auto* ids : {&a, &b, &a}) {
      KvCache cache(pool, 32);
      const int64_t adopted = cache.adopt_prefix(*ids);
      m->forward(std::span(*ids).subspan(adopted), cache, false);
    }
    KvCache again(pool, 32);  // a's blocks in RAM from its second run
    EXPECT_EQ(again.adopt_prefix(a), 28);
    EXPECT_EQ(m->forward(std::span(a).subspan(28), again, false), want);
    EXPECT_GT(pool->disk()->stats().write_errors, 0u);
    EXPECT_EQ(pool->disk()->stats().files, 0u);
    EXPECT_FALSE(tier.warnings.empty());
  }
}

// Past the bound the least recently used files go; the tier never holds more than the bound.
TEST_F(KvDiskTierTest, TheBoundKeepsTheMostRecentlyUsedFiles) {
  test::TempDir dir;
  std::vector<std::string> warnings;
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<std::byte> data(1000, std::byte{5});
  const uint64_t file = 8 + 4 + 4 + 8 * 4 + 4 + 4 + 8 + 4 * 4 + 1000 + 8;  // the header, data, checksum
  KvDiskTier tier({dir.path(), 3 * file, 1, 0, [&](const std::string& w) { warnings.push_back(w); }});
  for (uint64_t key = 1; key <= 5; ++key) EXPECT_TRUE(tier.store({key, 0, tokens, 0, 1}, data));
  EXPECT_EQ(tier.stats().files, 3u);
  EXPECT_EQ(tier.stats().bytes, 3 * file);
  EXPECT_EQ(tier.stats().removed, 2u);
  EXPECT_FALSE(tier.contains(1, 0));
  EXPECT_FALSE(tier.contains(2, 0));
  std::vector<std::byte> back(1000);
  EXPECT_TRUE(tier.load({3, 0, tokens, 0, 1}, back));  // 3 becomes the most recent
  EXPECT_EQ(back, data);
  EXPECT_TRUE(tier.store({6, 0, tokens, 0, 1}, data));
  EXPECT_TRUE(tier.contains(3, 0));
  EXPECT_FALSE(tier.contains(4, 0));
  // A reopened tier finds them again; a different identity finds none of them.
  EXPECT_EQ(KvDiskTier({dir.path(), 3 * file, 1, 0, {}}).stats().files, 3u);
  EXPECT_EQ(KvDiskTier({dir.path(), 3 * file, 2, 0, {}}).stats().files, 0u);
  EXPECT_TRUE(warnings.empty());
}

}  // namespace
}  // namespace qs
