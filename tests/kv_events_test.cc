// KV events: vLLM's block hashes and batch encoding against values Python's reference libraries give (cbor2 and
// hashlib as vllm.utils.hashing.sha256_cbor uses them; msgspec with vLLM's event types), and the event log following
// the prefix cache through eviction. tests/server/test_kv_events.py follows a running server the same way.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <set>

#include "checkpoint_tools/synth.h"
#include "model/gemma4.h"
#include "model/kv_block_hash.h"
#include "model/kv_cache.h"
#include "model/kv_events.h"
#include "server/kv_events_publisher.h"
#include "synth_util.h"
#include "test_util.h"

namespace qs {
namespace {

std::string hex(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

}  // namespace

// Expected values: hashlib.sha256(cbor2.dumps(x, canonical=True)) with cbor2 6.2.1.
TEST(KvEvents, BlockHashesAreVllmSha256Cbor) {
  const VllmBlockHash none = vllm_none_hash("vllm-none-hash");
  EXPECT_EQ(hex(none), "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
  const std::vector<int32_t> first = {2, 651, 0, 100000, 30, 70000, 5, 4294967, 0, 1, 2, 3, 4, 5, 6, 7};
  const VllmBlockHash a = vllm_block_hash(none, first);
  EXPECT_EQ(vllm_external_hash(a), 15281862069836189793ull);
  std::vector<int32_t> second(16);
  for (int i = 0; i < 16; ++i) second[i] = i;
  EXPECT_EQ(vllm_external_hash(vllm_block_hash(a, second, "my-adapter")), 11453803972886870833ull);
}

// Expected bytes: msgspec.msgpack.encode of vLLM's KVEventBatch (array_like, tagged) with msgspec 0.22.0.
TEST(KvEvents, BatchEncodesAsVllmMsgspec) {
  const std::vector<KvEvent> events = {
      {KvEvent::Kind::BlockStored, {(1ull << 63) + 5, 7}, std::nullopt, {1, 300}},
      {KvEvent::Kind::BlockStored, {9}, 7, {70000, 2}},
      {KvEvent::Kind::BlockRemoved, {7}, std::nullopt, {}},
      {KvEvent::Kind::AllBlocksCleared, {}, std::nullopt, {}},
  };
  const std::string bytes = encode_kv_event_batch(1.5, events, 2);
  EXPECT_EQ(hex(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())),
            "93cb3ff80000000000009497ab426c6f636b53746f72656492cf800000000000000507c09201cd012c02c0a347505597ab426c6f"
            "636b53746f72656491090792ce000111700202c0a347505593ac426c6f636b52656d6f7665649107a347505591b0416c6c426c"
            "6f636b73436c656172656400");
}

TEST(KvEvents, ConsecutiveBlocksOfAChainJoinOneBlockStored) {
  KvEventLog log(2, "seed");
  const int32_t t[] = {1, 2, 3, 4, 5, 6};
  log.stored(10, std::nullopt, std::span(t).first(2));
  log.stored(11, 10, std::span(t).subspan(2, 2));
  log.stored(20, 99, std::span(t).subspan(4, 2));  // another chain
  log.removed(10);
  log.removed(11);
  const auto events = log.take();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].block_hashes, (std::vector<uint64_t>{10, 11}));
  EXPECT_EQ(events[0].token_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_FALSE(events[0].parent_block_hash);
  EXPECT_EQ(events[1].parent_block_hash, 99u);
  EXPECT_EQ(events[2].block_hashes, (std::vector<uint64_t>{10, 11}));
  EXPECT_TRUE(log.take().empty());
}

// A pool with room for one sequence: each new prompt evicts the last one's blocks. The set rebuilt from the events
// equals the pool's own after each prompt, and every stored hash is vLLM's over the prompt's token ids.
TEST(KvEvents, FollowThePrefixCacheThroughEviction) {
  test::TempDir tmp;
  auto model = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp / "m"}), Precision::F32);
  const int64_t bs = 4;
  KvLayout layout = model->kv_layout(bs);
  auto pool = std::make_shared<KvPool>(layout, kv_pool_for_sequences(layout, 1, 32));
  auto log = std::make_shared<KvEventLog>(bs, "vllm-none-hash");
  pool->attach_events(log);
  std::multiset<uint64_t> rebuilt;
  std::set<uint64_t> vllm_hashes;
  int removed = 0;
  auto follow = [&] {
    for (const KvEvent& e : log->take()) {
      if (e.kind == KvEvent::Kind::AllBlocksCleared) rebuilt.clear();
      for (uint64_t h : e.block_hashes) {
        if (e.kind == KvEvent::Kind::BlockStored) {
          EXPECT_TRUE(vllm_hashes.count(h)) << h;
          rebuilt.insert(h);
        } else {
          ASSERT_TRUE(rebuilt.count(h)) << "removed a block never stored: " << h;
          rebuilt.erase(rebuilt.find(h));
          ++removed;
        }
      }
    }
    auto own = pool->reported_hashes();
    EXPECT_EQ(rebuilt, std::multiset<uint64_t>(own.begin(), own.end()));
  };
  follow();
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> ids = {2};
    for (int i = 1; i < 30; ++i) ids.push_back(10 + (i * 37 + (p % 3) * 11) % 4000);
    VllmBlockHash parent = log->none_hash();
    for (size_t i = 0; (i + 1) * bs <= ids.size(); ++i) {
      parent = vllm_block_hash(parent, std::span(ids).subspan(i * bs, bs));
      vllm_hashes.insert(vllm_external_hash(parent));
    }
    KvCache cache(pool, 32);
    const int64_t adopted = cache.adopt_prefix(ids);
    model->forward(std::span(ids).subspan(adopted), cache, false);
    follow();
  }
  EXPECT_GT(removed, 0) << "the pool never evicted";
}

}  // namespace qs
