#pragma once
// The paged KV cache. K/V live in fixed-size blocks of `block_size` positions, taken from a pool that every
// sequence of an engine shares; one pool per layer class, because the classes keep different amounts:
//   full-attention layers  hold every position: a new block every block_size positions;
//   sliding layers         hold only the blocks that still reach into the window (at most
//                          ceil((window - 1) / block_size) + 1 a sequence) and hand the others back at once;
//   KV-shared layers       own nothing: they read their donor's blocks.
// A block holds its class's owning layers together: [layer][K, V][position in block][row]. The row's dtype
// (KvLayout::dtype, `--kv-dtype`) is by default bf16 when the activations are bf16 (K/V are bf16-rounded already:
// lossless at half the bytes), else f32; or int8, lossy, at about half bf16's bytes:
//
// Int8 KV: a row is [kv_heads * head_dim int8 codes][kv_heads f32 scales], one scale per (position, KV head), with
// value = scale x code. At commit (append) each head's scale is amax / 127 in f32 and each code the nearest integer
// to value / scale (so |code| <= 127, the error at most scale / 2); the attention kernels read the codes directly
// (1 byte an element, exact as bf16 or f32) and apply the scale once per position: to the score, and to the
// probability that weighs V (that weight rounded to bf16 in a bf16 model, kernels/attention.h, so that bf16 dot
// products take it). No dequantized copy of the cache exists. Why this choice: llama.cpp's q8_0 cache keeps
// an f16 scale per 32 values (1.0625 bytes an element), vLLM's fp8 KV one f32 scale per tensor or per head for the
// whole cache (calibrated); Gemma 4 normalises K (k_norm, then RoPE) and V (a weightless RMSNorm) per head and
// position, so one head's row has no outlier channel a finer group would need, and its own amax keeps the error
// relative to that row (measured mean KL vs bf16 KV: BENCHMARKS.md). Per position, a scale never changes once
// written, so complete blocks stay immutable for the prefix cache. At head_dim 256 a row costs 260 bytes, 0.51x
// bf16's 512. fp8 (e4m3) is not offered: it has the same byte count, but 3 mantissa bits (relative error up to 1/16
// of each value against int8's 1/254 of the row's amax), and x86 before AVX10.2 has no e4m3 conversion, so the
// kernels would decode it by table or bit manipulation for no byte saved over int8.
//
// Prefix cache: each complete block is published under a key chained over every token id up to its end (the K/V
// of a position depend on those tokens only), so a later sequence that starts with the same tokens adopts the
// blocks instead of computing them. Blocks are reference counted and never written once complete; a published
// block that no sequence holds stays cached until the pool needs room (least recently released first, deepest
// blocks of a prefix before its first ones).
//
// Disk tier (kv_disk_tier.h, optional): a cached block the pool evicts, or still holds when it is destroyed, is
// written to disk first; a lookup that misses RAM reads the block back into a fresh pool block (published again,
// so later sequences find it in RAM). The K/V bytes are the ones written, so a restored prefix is exactly the one
// computed.
//
// KV events (kv_events.h, optional): the pool records what enters and leaves the prefix cache under vLLM's block
// hashes, which each sequence chains alongside its own keys while a log is attached.
//
// Speculative decoding: the last positions of a sequence may be tentative (draft tokens the target model is
// verifying). They are never published to the prefix cache, truncate() drops them, and sliding layers keep the
// blocks the window of the last verified position needs until they are verified or dropped (up to
// KvLayout::max_tentative positions more than the window), so dropping drafts never needs a block handed back.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/model_config.h"
#include "kernels/attention.h"
#include "util/function_ref.h"
#include "util/huge_buffer.h"
#include "model/kv_disk_tier.h"
#include "model/kv_events.h"

namespace qs {

enum class KvClass { Full = 0, Sliding = 1 };

// `--kv-dtype`: "f32" | "bf16" | "int8"; throws naming the accepted ones.
KvDtype parse_kv_dtype(const std::string& name);
std::string_view kv_dtype_name(KvDtype dtype);
// Bytes of one position's K (or V) row of a layer: its values, and int8's scales.
uint64_t kv_row_bytes(KvDtype dtype, int64_t kv_heads, int64_t head_dim);
// Writes `count` f32 K or V rows (kv_heads x head_dim values each) as a cache of `dtype` stores them, one row every
// kv_row_bytes(dtype, kv_heads, head_dim) bytes of `dst`: a call's own positions are attended in that form, so
// they read exactly what later calls will read back from the cache (bf16 values, or int8 codes and scales).
void encode_kv_rows(KvDtype dtype, std::byte* dst, const float* rows, int64_t count, int64_t kv_heads,
                    int64_t head_dim);
inline constexpr size_t kKvClasses = 2;

struct KvLayout {
  int64_t block_size = 16;
  int64_t window = 0;  // positions a sliding layer attends over, its own included
  KvDtype dtype = KvDtype::BF16;                // storage dtype of K and V
  int64_t max_tentative = 0;  // unverified positions a sequence may hold (speculative drafts): sliding layers keep
                              // that many positions more than their window
  std::vector<int> layer_class;                 // per model layer: a KvClass, or -1 when it owns no cache
  std::vector<int64_t> layer_slot;              // per model layer: its index among its class's owning layers
  std::array<int64_t, kKvClasses> layers{};     // owning layers per class
  std::array<int64_t, kKvClasses> heads{};      // kv_heads of the class's layers
  std::array<int64_t, kKvClasses> row{};        // kv_heads * head_dim of the class's layers

  uint64_t row_bytes(KvClass c) const {
    const size_t i = static_cast<size_t>(c);
    return heads[i] ? kv_row_bytes(dtype, heads[i], row[i] / heads[i]) : 0;
  }
  uint64_t block_bytes(KvClass c) const { return uint64_t(layers[size_t(c)]) * 2 * block_size * row_bytes(c); }
  // The most blocks of a class one sequence of n positions holds.
  int64_t max_blocks_held(KvClass c, int64_t n) const;
  // The first position a sliding layer still reads once a sequence holds n positions.
  int64_t first_live_position(int64_t n) const { return std::max<int64_t>(0, n - window + 1); }
  // The most sliding blocks a sequence holds: its window's, plus max_tentative positions.
  int64_t sliding_blocks_cap() const;
};

struct KvPoolSize {
  std::array<int64_t, kKvClasses> blocks{};
};
// Room for `sequences` sequences of `context` positions each, all at once.
KvPoolSize kv_pool_for_sequences(const KvLayout& layout, int64_t sequences, int64_t context);
// A byte budget. Sliding layers get what `sequences` windows need (never more than half the budget): more would
// only feed the prefix cache. The full layers, whose KV grows with the context, get the rest.
KvPoolSize kv_pool_for_budget(const KvLayout& layout, uint64_t bytes, int64_t sequences, int64_t context);
// The longest sequence a pool of `size` holds when it runs alone (INT64_MAX when unbounded).
int64_t kv_pool_max_positions(const KvLayout& layout, const KvPoolSize& size);
// The layout of a Gemma 4 text config: each layer that is not KV-shared owns rows of its kv_heads x head_dim in
// its class; `window` is what sliding layers keep (the config's sliding_window, or more for a drafter).
KvLayout kv_layout_for_config(const Gemma4TextConfig& text, KvDtype dtype, int64_t block_size, int64_t window);

class KvPool {
 public:
  KvPool(KvLayout layout, KvPoolSize size);  // allocates and zeroes the storage: resident from the start
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();  // writes the cached blocks to the disk tier, if any

  // Spills evicted blocks to `disk` and reads them back on a miss from now on.
  void attach_disk(std::unique_ptr<KvDiskTier> disk) { disk_ = std::move(disk); }
  const KvDiskTier* disk() const { return disk_.get(); }
  // Records what enters and leaves the prefix cache in `log` from now on (the pool must hold no cached block yet).
  void attach_events(std::shared_ptr<KvEventLog> log);
  KvEventLog* events() const { return events_.get(); }
  // The vLLM hashes of the prefix blocks the cache holds now, as KV events report them (kv_events.h): what a
  // consumer of every event so far holds.
  std::vector<uint64_t> reported_hashes() const;
  // The class whose blocks KV events report: the full-attention one, if the model has such layers.
  KvClass reported_class() const;

  const KvLayout& layout() const { return layout_; }
  int64_t blocks_total(KvClass c) const { return static_cast<int64_t>(classes_[size_t(c)].blocks.size()); }
  int64_t blocks_total() const { return blocks_total(KvClass::Full) + blocks_total(KvClass::Sliding); }
  int64_t blocks_used() const;                // held by at least one sequence
  int64_t blocks_cached() const;              // published and held by none: reclaimable
  int64_t blocks_available(KvClass c) const;  // free, or cached and held by none (evicted on demand)
  bool has_blocks(const std::array<int64_t, kKvClasses>& need) const;  // of each class (negative: gives back)
  uint64_t bytes() const;
  uint64_t bytes_used() const;
  // The longest sequence the pool holds when it runs alone (INT64_MAX when unbounded).
  int64_t max_positions() const;

 private:
  friend class KvCache;
  struct Block {
    int32_t refs = 0;
    bool cached = false;
    uint64_t key = 0;       // its prefix entry, when cached
    uint64_t released = 0;  // tick of its last release: the eviction order
  };
  struct Class {
    HugeBuffer data;
    std::vector<Block> blocks;
    std::vector<int32_t> free;                          // neither held nor cached
    std::set<std::pair<uint64_t, int32_t>> evictable;   // cached, held by none: (released, block), oldest first
  };
  // A prefix block's vLLM hash, and its parent's (none for a first block), for KV events.
  struct EventHashes {
    uint64_t self = 0;
    std::optional<uint64_t> parent;
  };
  struct Prefix {
    uint64_t parent = 0;
    uint64_t external = 0;        // its vLLM hash, when events are recorded
    std::vector<int32_t> tokens;  // the block's own tokens: a key is trusted only with its parent and tokens
    std::array<int32_t, kKvClasses> block{-1, -1};
  };

  std::byte* data(KvClass c, int32_t block);
  int32_t take(KvClass c);  // a free block, else the least recently released cached one (evicted)
  void hold(KvClass c, int32_t block);
  void release(KvClass c, int32_t block);
  const Prefix* find(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Whether a block of class c for this prefix entry is in RAM or on disk.
  bool has_cached(KvClass c, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Holds the block of class c for this prefix entry: the one in RAM, else one read back from disk into a fresh
  // block (then *from_disk is set). -1 when neither has it, the pool has no block to read it into, or the file is
  // rejected.
  int32_t hold_cached(KvClass c, uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool* from_disk,
                      const EventHashes& hashes);
  void spill(KvClass c, int32_t block);  // to the disk tier, when it is a cached block
  void publish(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, std::array<int32_t, kKvClasses> blocks,
               const EventHashes& hashes);

  KvLayout layout_;
  std::array<Class, kKvClasses> classes_;
  std::unordered_map<uint64_t, Prefix> prefixes_;
  uint64_t tick_ = 0;
  std::unique_ptr<KvDiskTier> disk_;
  std::shared_ptr<KvEventLog> events_;
};

// One sequence's block tables over a pool. Hands its blocks back when destroyed.
class KvCache {
 public:
  KvCache(std::shared_ptr<KvPool> pool, int64_t max_context);
  // A deep copy, in a pool of its own sized for one sequence of max_context (e.g. several decode streams from
  // one prefilled prompt).
  KvCache(const KvCache& other);
  KvCache& operator=(const KvCache& other) { return *this = KvCache(other); }
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  ~KvCache();

  int64_t length() const { return length_; }  // positions already processed
  int64_t verified() const { return verified_; }  // the first positions that are not tentative
  int64_t max_context() const { return max_context_; }
  const KvLayout& layout() const { return pool_->layout(); }
  int64_t blocks_held(KvClass c) const;
  // K/V bytes of max_context positions (full layers every position, sliding ones a window), block rounding aside.
  uint64_t capacity_bytes() const;

  // Net blocks of each class that appending n positions, the last `tentative` of them tentative, takes from the
  // pool (sliding layers may give some back).
  std::array<int64_t, kKvClasses> blocks_to_append(int64_t n, int64_t tentative = 0) const;
  // Throws, with the numbers, when the pool cannot take n more positions of this sequence.
  void check_room(int64_t n, int64_t tentative = 0) const;

  // On an empty cache, before adopt_prefix: K/V that depend on more than the tokens (a LoRA adapter's: its id)
  // key this cache's blocks apart from every other salt's, so that only sequences computed alike share them.
  // `name` (a LoRA adapter's) is the extra key of the vLLM block hashes KV events report.
  void set_prefix_salt(uint64_t salt, std::string_view name = {});
  // On an empty cache: takes the longest cached prefix of `tokens` that leaves at least one token to compute.
  // Returns the positions adopted (a multiple of block_size).
  int64_t adopt_prefix(std::span<const int32_t> tokens);
  // Of the positions the last adopt_prefix took, those in blocks read back from the disk tier.
  int64_t adopted_from_disk() const { return adopted_from_disk_; }

  // Where an owning layer keeps K (kv 0) or V (kv 1) of a held position: its row, in the layout's dtype.
  const std::byte* at(int64_t layer, int kv, int64_t pos) const;
  // Positions [pos, pos + count) of one KV head of an owning layer, for the attention kernels; they must lie in one
  // block.
  KvSegment segment(int64_t layer, int64_t kv_head, int64_t pos, int64_t count) const;
  // Appends `tokens` at positions length() onwards: hands back sliding blocks that left the window, takes blocks
  // for the new positions, stores each owning layer's rows (rows(layer, kv, j): the f32 row of the j-th new token;
  // int8 quantizes it, see the top of this file) and publishes the blocks this completes. The last `tentative` tokens
  // are drafts being verified: not published, and droppable by truncate(). Verified tokens cannot follow tentative
  // ones.
  using RowSource = FunctionRef<const float*(int64_t layer, int kv, int64_t j)>;
  void append(std::span<const int32_t> tokens, const RowSource& rows, int64_t tentative = 0);
  // Keeps the first `length` positions, verified from now on (publishing the blocks this completes), and drops
  // the tentative ones after them. Throws when that would drop a verified position.
  void truncate(int64_t length);

 private:
  void release_all();
  void reserve_tables();
  std::byte* slot(int64_t layer, int kv, int64_t pos);
  void publish_complete_blocks();
  int64_t verified_after(int64_t n, int64_t tentative) const;
  int64_t try_adopt_prefix(std::span<const int32_t> tokens, bool* retry);
  // The vLLM hash of the block after `parent` (the one before it; null: the first block), when events are recorded.
  VllmBlockHash event_hash(const VllmBlockHash* parent, std::span<const int32_t> tokens) const;
  KvPool::EventHashes event_hashes(const std::vector<VllmBlockHash>& chain, size_t i) const;

  std::shared_ptr<KvPool> pool_;
  std::array<std::vector<int32_t>, kKvClasses> blocks_;  // block id by block index; -1: not held
  int64_t first_sliding_ = 0;     // sliding blocks below this index are all handed back
  std::vector<int32_t> tokens_;   // the ids at every position, for the prefix keys
  std::vector<uint64_t> keys_;    // prefix key of each complete block
  uint64_t root_key_ = 0;         // the parent key of its first block (set_prefix_salt)
  std::string salt_name_;         // the extra key of its vLLM block hashes (set_prefix_salt)
  std::vector<VllmBlockHash> event_hashes_;  // vLLM hash of each complete block, while the pool records events
  int64_t length_ = 0, verified_ = 0, max_context_ = 0;
  int64_t adopted_from_disk_ = 0;
};

}  // namespace qs
