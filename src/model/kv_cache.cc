#include "model/kv_cache.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "formats/dtype.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace qs {
namespace {

constexpr KvClass kClasses[] = {KvClass::Full, KvClass::Sliding};
constexpr size_t kFull = 0, kSliding = 1;
constexpr uint64_t kRootKey = 0x51a7c0de5eedull;  // the parent key of a sequence's first block

size_t idx(KvClass c) { return static_cast<size_t>(c); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
const char* class_name(KvClass c) { return c == KvClass::Full ? "full-attention" : "sliding-window"; }

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A block's key: its parent's key chained with its own token ids, so it stands for every token up to its end.
uint64_t prefix_key(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

// One head's int8 scale, amax / 127 (the design at the top of kv_cache.h). A NaN or infinite value makes it NaN,
// which carries into attention as the bf16 cache would carry the value.
float int8_scale(const float* x, int64_t d) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::abs(x[i])), finite = finite && std::isfinite(x[i]);
  return finite ? amax / 127.0f : NAN;
}

int8_t int8_code(float x, float scale) {
  return scale > 0 ? static_cast<int8_t>(std::clamp(std::nearbyint(x / scale), -127.0f, 127.0f)) : 0;
}

void quantize_head(int8_t* codes, std::byte* scale_at, const float* x, int64_t d) {
  const float scale = int8_scale(x, d);
  for (int64_t i = 0; i < d; ++i) codes[i] = int8_code(x[i], scale);
  std::memcpy(scale_at, &scale, sizeof scale);
}

void store_row(std::byte* dst, const float* src, int64_t row, int64_t heads, KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32:
      std::memcpy(dst, src, row * sizeof(float));
      return;
    case KvDtype::BF16:
      for (int64_t i = 0; i < row; ++i) {
        const uint16_t b = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
    case KvDtype::Int8: {
      const int64_t d = row / heads;
      for (int64_t h = 0; h < heads; ++h)
        quantize_head(reinterpret_cast<int8_t*>(dst) + h * d, dst + row + h * sizeof(float), src + h * d, d);
      return;
    }
  }
}

}  // namespace

KvDtype parse_kv_dtype(const std::string& name) {
  if (name == "f32") return KvDtype::F32;
  if (name == "bf16") return KvDtype::BF16;
  if (name == "int8") return KvDtype::Int8;
  throw Error(fmt::format("KV cache dtype '{}': expected f32, bf16 or int8", name));
}

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32: return "f32";
    case KvDtype::BF16: return "bf16";
    case KvDtype::Int8: return "int8";
  }
  return "?";
}

uint64_t kv_row_bytes(KvDtype dtype, int64_t kv_heads, int64_t head_dim) {
  const uint64_t values = uint64_t(kv_heads) * head_dim;
  switch (dtype) {
    case KvDtype::F32: return values * 4;
    case KvDtype::BF16: return values * 2;
    case KvDtype::Int8: return values + uint64_t(kv_heads) * sizeof(float);
  }
  return 0;
}

void encode_kv_rows(KvDtype dtype, std::byte* dst, const float* rows, int64_t count, int64_t kv_heads,
                    int64_t head_dim) {
  const int64_t row = kv_heads * head_dim, row_bytes = static_cast<int64_t>(kv_row_bytes(dtype, kv_heads, head_dim));
  for (int64_t j = 0; j < count; ++j) store_row(dst + j * row_bytes, rows + j * row, row, kv_heads, dtype);
}

int64_t KvLayout::max_blocks_held(KvClass c, int64_t n) const {
  if (layers[idx(c)] == 0 || n <= 0) return 0;
  const int64_t all = ceil_div(n, block_size);
  if (c == KvClass::Full) return all;
  return std::min(all, sliding_blocks_cap());
}

int64_t KvLayout::sliding_blocks_cap() const {
  return ceil_div(std::max<int64_t>(window - 1, 0) + max_tentative, block_size) + 1;
}

KvPoolSize kv_pool_for_sequences(const KvLayout& layout, int64_t sequences, int64_t context) {
  KvPoolSize s;
  for (KvClass c : kClasses) s.blocks[idx(c)] = sequences * layout.max_blocks_held(c, context);
  return s;
}

KvPoolSize kv_pool_for_budget(const KvLayout& layout, uint64_t bytes, int64_t sequences, int64_t context) {
  KvPoolSize s;
  const uint64_t full = layout.block_bytes(KvClass::Full), sliding = layout.block_bytes(KvClass::Sliding);
  if (sliding) {
    const uint64_t windows = uint64_t(sequences * layout.max_blocks_held(KvClass::Sliding, context)) * sliding;
    s.blocks[kSliding] = static_cast<int64_t>((full ? std::min(windows, bytes / 2) : bytes) / sliding);
  }
  if (full) s.blocks[kFull] = static_cast<int64_t>((bytes - s.blocks[kSliding] * sliding) / full);
  return s;
}

int64_t kv_pool_max_positions(const KvLayout& layout, const KvPoolSize& size) {
  int64_t most = std::numeric_limits<int64_t>::max();
  const int64_t bs = layout.block_size;
  if (layout.layers[kFull]) most = std::min(most, size.blocks[kFull] * bs);
  if (layout.layers[kSliding] && size.blocks[kSliding] < layout.sliding_blocks_cap())
    most = std::min(most, size.blocks[kSliding] * bs);
  return most;
}

KvLayout kv_layout_for_config(const Gemma4TextConfig& text, KvDtype dtype, int64_t block_size, int64_t window) {
  KvLayout layout;
  layout.block_size = block_size;
  layout.window = window;
  layout.dtype = dtype;
  for (int64_t l = 0; l < text.num_hidden_layers; ++l) {
    const size_t c = text.is_full(l) ? kFull : kSliding;
    const bool owns = !text.is_kv_shared(l);
    layout.layer_class.push_back(owns ? static_cast<int>(c) : -1);
    layout.layer_slot.push_back(owns ? layout.layers[c]++ : -1);
    if (owns) layout.heads[c] = text.layer_kv_heads(l), layout.row[c] = text.layer_kv_heads(l) * text.layer_head_dim(l);
  }
  return layout;
}

KvPool::KvPool(KvLayout layout, KvPoolSize size) : layout_(std::move(layout)) {
  if (layout_.block_size < 1) throw Error(fmt::format("KV block size {}: expected at least 1", layout_.block_size));
  for (KvClass c : kClasses) {
    Class& k = classes_[idx(c)];
    const int64_t n = layout_.layers[idx(c)] ? size.blocks[idx(c)] : 0;
    if (n < 0 || n > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("KV pool: {} blocks for the {} layers is out of range", n, class_name(c)));
    // On huge pages: decode at depth reads every block of a long context, and on 4 KiB pages each of its rows
    // crossed into a new page every few positions (measured: the weighted sum of V 1.8x slower at 32K positions).
    // Written through once, so that the memory is resident from the start.
    k.data = HugeBuffer(n * layout_.block_bytes(c));
    std::memset(k.data.data(), 0, k.data.size());
    k.blocks.resize(n);
    for (int64_t b = n - 1; b >= 0; --b) k.free.push_back(static_cast<int32_t>(b));  // lowest ids first
  }
  // Every prefix entry holds at least one block of its own: the table never grows past this, so never rehashes.
  prefixes_.reserve(classes_[kFull].blocks.size() + classes_[kSliding].blocks.size());
}

int64_t KvPool::blocks_used() const {
  int64_t n = 0;
  for (const Class& k : classes_) n += static_cast<int64_t>(k.blocks.size() - k.free.size() - k.evictable.size());
  return n;
}

int64_t KvPool::blocks_cached() const { return classes_[kFull].evictable.size() + classes_[kSliding].evictable.size(); }

int64_t KvPool::blocks_available(KvClass c) const {
  const Class& k = classes_[idx(c)];
  return static_cast<int64_t>(k.free.size() + k.evictable.size());
}

uint64_t KvPool::bytes() const { return classes_[kFull].data.size() + classes_[kSliding].data.size(); }

uint64_t KvPool::bytes_used() const {
  uint64_t n = 0;
  for (KvClass c : kClasses) n += (blocks_total(c) - blocks_available(c)) * layout_.block_bytes(c);
  return n;
}

int64_t KvPool::max_positions() const {
  return kv_pool_max_positions(layout_, {{blocks_total(KvClass::Full), blocks_total(KvClass::Sliding)}});
}
std::byte* KvPool::data(KvClass c, int32_t block) {
  return classes_[idx(c)].data.data() + uint64_t(block) * layout_.block_bytes(c);
}

int32_t KvPool::take(KvClass c) {
  Class& k = classes_[idx(c)];
  int32_t b;
  if (!k.free.empty()) {
    b = k.free.back();
    k.free.pop_back();
  } else {
    if (k.evictable.empty()) throw Error(fmt::format("the KV pool has no free block for the {} layers", class_name(c)));
    b = k.evictable.begin()->second;
    k.evictable.erase(k.evictable.begin());
    spill(c, b);
    auto it = prefixes_.find(k.blocks[b].key);
    if (events_ && c == reported_class()) events_->removed(it->second.external);
    it->second.block[idx(c)] = -1;
    if (it->second.block == std::array<int32_t, kKvClasses>{-1, -1}) prefixes_.erase(it);
    k.blocks[b].cached = false;
  }
  k.blocks[b].refs = 1;
  return b;
}

void KvPool::hold(KvClass c, int32_t block) {
  Block& b = classes_[idx(c)].blocks[block];
  if (b.refs++ == 0) classes_[idx(c)].evictable.erase({b.released, block});
}

void KvPool::release(KvClass c, int32_t block) {
  Class& k = classes_[idx(c)];
  Block& b = k.blocks[block];
  if (--b.refs > 0) return;
  b.released = ++tick_;
  if (b.cached) k.evictable.insert({b.released, block});
  else k.free.push_back(block);
}

KvPool::~KvPool() {
  if (!disk_) return;
  for (KvClass c : kClasses)  // least recently released first: the disk tier keeps the most recent longest
    for (const auto& [released, block] : classes_[idx(c)].evictable) spill(c, block);
}

void KvPool::spill(KvClass c, int32_t block) {
  const Block& b = classes_[idx(c)].blocks[block];
  if (!disk_ || !b.cached) return;
  const Prefix& p = prefixes_.at(b.key);
  disk_->store({b.key, p.parent, p.tokens, static_cast<int>(c), static_cast<int32_t>(layout_.dtype)},
               std::span<const std::byte>(data(c, block), layout_.block_bytes(c)));
}

bool KvPool::has_cached(KvClass c, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  const Prefix* p = find(key, parent, tokens);
  return (p && p->block[idx(c)] >= 0) || (disk_ && disk_->contains(key, static_cast<int>(c)));
}

int32_t KvPool::hold_cached(KvClass c, uint64_t key, uint64_t parent, std::span<const int32_t> tokens,
                            bool* from_disk, const EventHashes& hashes) {
  if (const Prefix* p = find(key, parent, tokens); p && p->block[idx(c)] >= 0) {
    hold(c, p->block[idx(c)]);
    return p->block[idx(c)];
  }
  if (!disk_ || !disk_->contains(key, static_cast<int>(c)) || blocks_available(c) == 0) return -1;
  const int32_t block = take(c);  // may evict another cached block, never a held one
  const DiskBlockId id{key, parent, tokens, static_cast<int>(c), static_cast<int32_t>(layout_.dtype)};
  if (!disk_->load(id, std::span<std::byte>(data(c, block), layout_.block_bytes(c)))) {
    release(c, block);
    return -1;
  }
  std::array<int32_t, kKvClasses> ids{-1, -1};
  ids[idx(c)] = block;
  publish(key, parent, tokens, ids, hashes);
  *from_disk = true;
  return block;
}

const KvPool::Prefix* KvPool::find(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = prefixes_.find(key);
  if (it == prefixes_.end() || it->second.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end()))
    return nullptr;
  return &it->second;
}

void KvPool::publish(uint64_t key, uint64_t parent, std::span<const int32_t> tokens,
                     std::array<int32_t, kKvClasses> blocks, const EventHashes& hashes) {
  auto [it, fresh] = prefixes_.try_emplace(key);
  Prefix& p = it->second;
  if (fresh) {
    p.parent = parent;
    p.tokens.assign(tokens.begin(), tokens.end());
    p.external = hashes.self;
  } else if (!find(key, parent, tokens)) {
    return;  // a key collision: the first owner keeps the key
  }
  for (KvClass c : kClasses) {
    const int32_t id = blocks[idx(c)];
    if (p.block[idx(c)] >= 0 || id < 0 || classes_[idx(c)].blocks[id].cached) continue;
    p.block[idx(c)] = id;
    classes_[idx(c)].blocks[id].cached = true;
    classes_[idx(c)].blocks[id].key = key;
    if (events_ && c == reported_class()) events_->stored(p.external, hashes.parent, tokens);
  }
  if (p.block == std::array<int32_t, kKvClasses>{-1, -1}) prefixes_.erase(it);
}

KvClass KvPool::reported_class() const { return layout_.layers[kFull] ? KvClass::Full : KvClass::Sliding; }

void KvPool::attach_events(std::shared_ptr<KvEventLog> log) {
  if (!prefixes_.empty()) throw Error("KV events: attach the log before the prefix cache holds a block");
  events_ = std::move(log);
  events_->cleared();  // a consumer that followed an earlier process drops what it held
}

std::vector<uint64_t> KvPool::reported_hashes() const {
  std::vector<uint64_t> hashes;
  for (const auto& [key, p] : prefixes_)
    if (p.block[idx(reported_class())] >= 0) hashes.push_back(p.external);
  return hashes;
}

// ---- KvCache --------------------------------------------------------------------------------------------------

KvCache::KvCache(std::shared_ptr<KvPool> pool, int64_t max_context)
    : pool_(std::move(pool)), root_key_(kRootKey), max_context_(max_context) {
  reserve_tables();
}

void KvCache::set_prefix_salt(uint64_t salt, std::string_view name) {
  if (length_ != 0) throw Error("set_prefix_salt: the cache already holds positions");
  root_key_ = salt ? mix(kRootKey ^ mix(salt)) : kRootKey;
  salt_name_ = name;
}

VllmBlockHash KvCache::event_hash(const VllmBlockHash* parent, std::span<const int32_t> tokens) const {
  const KvEventLog* log = pool_->events();
  return log ? vllm_block_hash(parent ? *parent : log->none_hash(), tokens, salt_name_) : VllmBlockHash{};
}

KvPool::EventHashes KvCache::event_hashes(const std::vector<VllmBlockHash>& chain, size_t i) const {
  if (!pool_->events()) return {};
  return {vllm_external_hash(chain[i]), i ? std::optional(vllm_external_hash(chain[i - 1])) : std::nullopt};
}

// Room for max_context positions in the tables up front, so that appending never reallocates them.
void KvCache::reserve_tables() {
  const int64_t blocks = max_context_ / layout().block_size + 1;
  tokens_.reserve(max_context_);
  keys_.reserve(blocks);
  for (auto& table : blocks_) table.reserve(blocks);
}

KvCache::KvCache(KvCache&& other) noexcept { *this = std::move(other); }

KvCache::KvCache(const KvCache& other)
    : pool_(std::make_shared<KvPool>(other.layout(), kv_pool_for_sequences(other.layout(), 1, other.max_context_))),
      first_sliding_(other.first_sliding_), tokens_(other.tokens_), keys_(other.keys_), root_key_(other.root_key_),
      salt_name_(other.salt_name_), event_hashes_(other.event_hashes_), length_(other.length_),
      verified_(other.verified_), max_context_(other.max_context_) {
  reserve_tables();
  for (KvClass c : kClasses)
    for (int32_t block : other.blocks_[idx(c)]) {
      if (block < 0) {
        blocks_[idx(c)].push_back(-1);
        continue;
      }
      blocks_[idx(c)].push_back(pool_->take(c));
      std::memcpy(pool_->data(c, blocks_[idx(c)].back()), other.pool_->data(c, block), layout().block_bytes(c));
    }
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this == &other) return *this;
  release_all();
  pool_ = std::exchange(other.pool_, nullptr);
  blocks_ = std::exchange(other.blocks_, {});
  first_sliding_ = std::exchange(other.first_sliding_, 0);
  tokens_ = std::exchange(other.tokens_, {});
  keys_ = std::exchange(other.keys_, {});
  root_key_ = other.root_key_;
  salt_name_ = other.salt_name_;
  event_hashes_ = std::exchange(other.event_hashes_, {});
  length_ = std::exchange(other.length_, 0);
  verified_ = std::exchange(other.verified_, 0);
  max_context_ = other.max_context_;
  adopted_from_disk_ = std::exchange(other.adopted_from_disk_, 0);
  return *this;
}

KvCache::~KvCache() { release_all(); }

// Deepest blocks first: released last, a prefix's first blocks are evicted last.
void KvCache::release_all() {
  if (!pool_) return;
  for (KvClass c : kClasses) {
    auto& table = blocks_[idx(c)];
    for (auto it = table.rbegin(); it != table.rend(); ++it)
      if (*it >= 0) pool_->release(c, *it);
    table.clear();
  }
}

int64_t KvCache::blocks_held(KvClass c) const {
  return std::count_if(blocks_[idx(c)].begin(), blocks_[idx(c)].end(), [](int32_t b) { return b >= 0; });
}

uint64_t KvCache::capacity_bytes() const {
  const KvLayout& l = layout();
  const uint64_t per_position[] = {l.block_bytes(KvClass::Full) / l.block_size, l.block_bytes(KvClass::Sliding) / l.block_size};
  return per_position[kFull] * max_context_ + per_position[kSliding] * std::min(max_context_, l.window);
}

// Verified positions once n more are appended, the last `tentative` of them tentative.
int64_t KvCache::verified_after(int64_t n, int64_t tentative) const {
  return verified_ == length_ ? length_ + n - tentative : verified_;
}

std::array<int64_t, kKvClasses> KvCache::blocks_to_append(int64_t n, int64_t tentative) const {
  const KvLayout& l = layout();
  const int64_t bs = l.block_size, end = length_ + n;
  std::array<int64_t, kKvClasses> need{};
  if (n <= 0) return need;
  if (l.layers[kFull]) need[kFull] = ceil_div(end, bs) - static_cast<int64_t>(blocks_[kFull].size());
  if (l.layers[kSliding]) {
    const auto& table = blocks_[kSliding];
    const int64_t lo = l.first_live_position(verified_after(n, tentative)) / bs, hi = (end - 1) / bs;
    const int64_t size = table.size();
    for (int64_t i = first_sliding_; i < std::min(lo, size); ++i) need[kSliding] -= table[i] >= 0;
    for (int64_t i = lo; i <= hi; ++i) need[kSliding] += i >= size || table[i] < 0;
  }
  return need;
}

bool KvPool::has_blocks(const std::array<int64_t, kKvClasses>& need) const {
  for (KvClass c : kClasses)
    if (need[idx(c)] > blocks_available(c)) return false;
  return true;
}

void KvCache::check_room(int64_t n, int64_t tentative) const {
  const auto need = blocks_to_append(n, tentative);
  if (pool_->has_blocks(need)) return;
  for (KvClass c : kClasses)
    if (need[idx(c)] > pool_->blocks_available(c))
      throw Error(fmt::format("the KV pool has {} free blocks of {} positions for the {} layers; {} more positions "
                              "of this sequence need {}",
                              pool_->blocks_available(c), layout().block_size, class_name(c), n, need[idx(c)]));
}

int64_t KvCache::adopt_prefix(std::span<const int32_t> tokens) {
  if (length_ != 0) return 0;
  bool retry = false;
  const int64_t adopted = try_adopt_prefix(tokens, &retry);
  return retry ? try_adopt_prefix(tokens, &retry) : adopted;  // once more without the block the disk rejected
}

// Walks the prefix chain block by block, holding each full-attention block as it goes (so that reading one back
// from disk never evicts another of the same prefix), then takes the longest prefix whose sliding blocks cover
// the window before its end. A block that could not be read after all (a rejected file, no pool block to read it
// into) hands everything back and asks for one retry, which then stops short of it.
int64_t KvCache::try_adopt_prefix(std::span<const int32_t> tokens, bool* retry) {
  const KvLayout& l = layout();
  const int64_t bs = l.block_size;
  const bool full = l.layers[kFull] > 0, sliding = l.layers[kSliding] > 0;
  std::vector<uint64_t> keys, parents;
  std::vector<int32_t> full_ids;
  std::vector<bool> from_disk;
  std::vector<VllmBlockHash> chain;  // vLLM's hashes, while events are recorded
  auto block_tokens = [&](int64_t i) { return tokens.subspan(i * bs, bs); };
  uint64_t parent = root_key_;
  for (int64_t i = 0; (i + 1) * bs < static_cast<int64_t>(tokens.size()) && (i + 1) * bs <= max_context_; ++i) {
    const uint64_t key = prefix_key(parent, block_tokens(i));
    chain.push_back(event_hash(i ? &chain.back() : nullptr, block_tokens(i)));
    bool disk = false;
    if (full) {
      const int32_t id = pool_->hold_cached(KvClass::Full, key, parent, block_tokens(i), &disk, event_hashes(chain, i));
      if (id < 0) break;
      full_ids.push_back(id);
    } else if (!pool_->has_cached(KvClass::Sliding, key, parent, block_tokens(i))) {
      break;
    }
    keys.push_back(key);
    parents.push_back(parent);
    from_disk.push_back(disk);
    parent = key;
  }
  auto window_cached = [&](int64_t k) {
    for (int64_t i = l.first_live_position(k * bs) / bs; i < k; ++i)
      if (!pool_->has_cached(KvClass::Sliding, keys[i], parents[i], block_tokens(i))) return false;
    return true;
  };
  int64_t k = static_cast<int64_t>(keys.size());
  while (sliding && k > 0 && !window_cached(k)) --k;
  for (int64_t i = static_cast<int64_t>(full_ids.size()) - 1; i >= k; --i) pool_->release(KvClass::Full, full_ids[i]);
  full_ids.resize(std::min<size_t>(full_ids.size(), k));
  blocks_[kFull] = full_ids;
  if (sliding && k > 0) {
    blocks_[kSliding].assign(k, -1);
    first_sliding_ = l.first_live_position(k * bs) / bs;
    for (int64_t i = first_sliding_; i < k; ++i) {
      bool disk = false;
      blocks_[kSliding][i] =
          pool_->hold_cached(KvClass::Sliding, keys[i], parents[i], block_tokens(i), &disk, event_hashes(chain, i));
      from_disk[i] = from_disk[i] || disk;
      if (blocks_[kSliding][i] < 0) {
        release_all();
        first_sliding_ = 0;
        *retry = true;
        return 0;
      }
    }
  }
  if (k == 0) return 0;
  const int64_t adopted = k * bs;
  tokens_.assign(tokens.begin(), tokens.begin() + adopted);
  keys_.assign(keys.begin(), keys.begin() + k);
  if (pool_->events()) event_hashes_.assign(chain.begin(), chain.begin() + k);
  length_ = verified_ = adopted;
  adopted_from_disk_ = bs * std::count(from_disk.begin(), from_disk.begin() + k, true);
  return adopted;
}

const std::byte* KvCache::at(int64_t layer, int kv, int64_t pos) const {
  const KvLayout& l = layout();
  const KvClass c = static_cast<KvClass>(l.layer_class[layer]);
  const int32_t block = blocks_[idx(c)][pos / l.block_size];
  const int64_t rows = (l.layer_slot[layer] * 2 + kv) * l.block_size + pos % l.block_size;
  return pool_->data(c, block) + rows * l.row_bytes(c);
}

KvSegment KvCache::segment(int64_t layer, int64_t kv_head, int64_t pos, int64_t count) const {
  const KvLayout& l = layout();
  const KvClass c = static_cast<KvClass>(l.layer_class[layer]);
  const int64_t row = l.row[idx(c)], d = row / l.heads[idx(c)], stride = static_cast<int64_t>(l.row_bytes(c));
  const std::byte *k = at(layer, 0, pos), *v = at(layer, 1, pos);
  const int64_t value_bytes = l.dtype == KvDtype::F32 ? 4 : l.dtype == KvDtype::BF16 ? 2 : 1;
  KvSegment segment{k + kv_head * d * value_bytes, v + kv_head * d * value_bytes, stride, count, l.dtype};
  if (l.dtype == KvDtype::Int8) {
    const int64_t scale = row + kv_head * int64_t(sizeof(float));
    segment.k_scale = k + scale, segment.v_scale = v + scale;
  }
  segment.position = pos;
  return segment;
}

std::byte* KvCache::slot(int64_t layer, int kv, int64_t pos) { return const_cast<std::byte*>(at(layer, kv, pos)); }

void KvCache::append(std::span<const int32_t> tokens, const RowSource& rows, int64_t tentative) {
  const KvLayout& l = layout();
  const int64_t bs = l.block_size, n = static_cast<int64_t>(tokens.size()), end = length_ + n;
  if (tentative < 0 || tentative > n || (tentative < n && verified_ < length_))
    throw Error(fmt::format("KV cache: appending {} positions, the last {} tentative, after {} tentative ones: "
                            "verified positions cannot follow tentative ones", n, tentative, length_ - verified_));
  const int64_t verified = verified_after(n, tentative);
  if (end - verified > l.max_tentative)
    throw Error(fmt::format("KV cache: {} tentative positions, but the layout keeps room for {}", end - verified,
                            l.max_tentative));
  check_room(n, tentative);
  if (l.layers[kFull])
    while (static_cast<int64_t>(blocks_[kFull].size()) * bs < end) blocks_[kFull].push_back(pool_->take(KvClass::Full));
  int64_t sliding_from = length_;  // the first new position sliding layers store: whole blocks inside the window
  if (l.layers[kSliding]) {
    auto& table = blocks_[kSliding];
    const int64_t lo = l.first_live_position(verified) / bs, hi = (end - 1) / bs;
    for (int64_t i = first_sliding_; i < std::min<int64_t>(lo, table.size()); ++i)
      if (table[i] >= 0) pool_->release(KvClass::Sliding, std::exchange(table[i], -1));
    first_sliding_ = std::max(first_sliding_, lo);
    table.resize(hi + 1, -1);
    for (int64_t i = lo; i <= hi; ++i)
      if (table[i] < 0) table[i] = pool_->take(KvClass::Sliding);
    sliding_from = std::max(length_, lo * bs);
  }
  for (size_t layer = 0; layer < l.layer_class.size(); ++layer) {
    const int c = l.layer_class[layer];
    if (c < 0) continue;
    const int64_t first = c == static_cast<int>(kSliding) ? sliding_from - length_ : 0;
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t j = first; j < n; ++j)
        store_row(slot(layer, kv, length_ + j), rows(layer, kv, j), l.row[c], l.heads[c], l.dtype);
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  length_ = end;
  verified_ = verified;
  publish_complete_blocks();
}

void KvCache::truncate(int64_t length) {
  if (length < verified_ || length > length_)
    throw Error(fmt::format("KV cache: cannot keep {} positions of {}: the first {} are verified", length, length_,
                            verified_));
  const int64_t blocks = ceil_div(length, layout().block_size);
  for (KvClass c : kClasses) {
    auto& table = blocks_[idx(c)];
    for (int64_t i = static_cast<int64_t>(table.size()) - 1; i >= blocks; --i)
      if (table[i] >= 0) pool_->release(c, table[i]);
    if (static_cast<int64_t>(table.size()) > blocks) table.resize(blocks);
  }
  tokens_.resize(length);
  length_ = verified_ = length;
  publish_complete_blocks();
}

void KvCache::publish_complete_blocks() {
  const int64_t bs = layout().block_size;
  for (int64_t i = static_cast<int64_t>(keys_.size()); (i + 1) * bs <= verified_; ++i) {
    const uint64_t parent = i ? keys_[i - 1] : root_key_;
    const auto block_tokens = std::span<const int32_t>(tokens_).subspan(i * bs, bs);
    keys_.push_back(prefix_key(parent, block_tokens));
    if (pool_->events()) event_hashes_.push_back(event_hash(i ? &event_hashes_[i - 1] : nullptr, block_tokens));
    std::array<int32_t, kKvClasses> ids{-1, -1};
    for (size_t c = 0; c < kKvClasses; ++c)
      if (i < static_cast<int64_t>(blocks_[c].size())) ids[c] = blocks_[c][i];
    pool_->publish(keys_.back(), parent, block_tokens, ids, event_hashes(event_hashes_, i));
  }
}

}  // namespace qs
