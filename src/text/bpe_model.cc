#include "text/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "text/utf8.h"
#include "util/error.h"

namespace qs::text {
namespace {

constexpr uint32_t kMetaspace = 0x2581;  // "▁"

struct Symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes; 0 = merged away
};
struct HeapItem {
  uint64_t key;  // rank << 32 | position: smallest rank first, then leftmost
  int32_t new_id;
  bool operator<(const HeapItem& o) const { return key > o.key; }  // for a min-heap with std::push_heap
};

// Merges by rank (tokenizers' Word::merge_all without dropout).
void merge_all(std::vector<Symbol>& sym, std::vector<HeapItem>& heap, const PairMap& merges) {
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (const PairMap::Value* m = merges.find(sym[i].id, sym[i + 1].id))
      heap.push_back({(uint64_t{m->rank} << 32) | i, m->new_id});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    HeapItem top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<int32_t>(top.key & 0xFFFFFFFFu);
    Symbol& cur = sym[pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t right = cur.next;
    const PairMap::Value* m = merges.find(cur.id, sym[right].id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += sym[right].len;
    cur.next = sym[right].next;
    sym[right].len = 0;
    if (cur.next >= 0) sym[cur.next].prev = pos;
    if (cur.prev >= 0) {
      if (const PairMap::Value* mp = merges.find(sym[cur.prev].id, cur.id)) {
        heap.push_back({(uint64_t{mp->rank} << 32) | static_cast<uint32_t>(cur.prev), mp->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const PairMap::Value* mn = merges.find(cur.id, sym[cur.next].id)) {
        heap.push_back({(uint64_t{mn->rank} << 32) | static_cast<uint32_t>(pos), mn->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// VocabIndex, PairMap

void VocabIndex::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{0, -1});
  mask_ = cap - 1;
}

int32_t VocabIndex::find(std::string_view s) const {
  const uint64_t h = hash_bytes(s);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = slots_[i];
    if (slot.id < 0) return -1;
    if (slot.tag == tag && (*strings_)[slot.id] == s) return slot.id;
  }
}

int32_t VocabIndex::assign(std::string_view s, int32_t id) {
  const uint64_t h = hash_bytes(s);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    Slot& slot = slots_[i];
    if (slot.id < 0) {
      slot = {tag, id};
      ++size_;
      return -1;
    }
    if (slot.tag == tag && (*strings_)[slot.id] == s) return std::exchange(slot.id, id);
  }
}

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, {0, -1}});
  mask_ = cap - 1;
  shift_ = 64;
  for (size_t c = cap; c > 1; c >>= 1) --shift_;
}

void PairMap::insert(int32_t a, int32_t b, Value v) {
  uint64_t key = pack(a, b);
  size_t i = slot(key);
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  slots_[i] = {key, v};
}

const PairMap::Value* PairMap::find(int32_t a, int32_t b) const {
  uint64_t key = pack(a, b);
  size_t i = slot(key);
  while (true) {
    if (slots_[i].key == key) return &slots_[i].value;
    if (slots_[i].key == kEmpty) return nullptr;
    i = (i + 1) & mask_;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Loading

void BpeModel::parse_options(const TokenizerJson& file, const JsonFields& fields) {
  source_ = fields.source();
  const json* model = JsonFields::member(file.root, "model");
  if (!model || !model->is_object()) fields.fail("missing \"model\" object");
  if (const json* t = JsonFields::member(*model, "type"); t && (!t->is_string() || *t != "BPE"))
    fields.fail(fmt::format("model.type is {}, only \"BPE\" is supported", t->dump()));
  if (!file.vocab_seen) {
    if (model->contains("vocab")) fields.fail("model.vocab must be an object mapping token strings to ids");
    fields.fail("missing model.vocab");
  }
  if (!file.merges_seen) {
    if (model->contains("merges")) fields.fail("model.merges must be an array");
    fields.fail("missing model.merges");
  }
  if (const json* d = JsonFields::member(*model, "dropout"); d && !d->is_null()) {
    if (!d->is_number()) fields.fail("model.dropout must be a number or null");
    if (d->get<double>() != 0.0)
      fields.fail("model.dropout: BPE dropout is not supported (it is random); expected null");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = JsonFields::member(*model, k);
    if (v && !v->is_null() && !(v->is_string() && v->get<std::string>().empty()))
      fields.fail(fmt::format("model.{} is not supported (expected null)", k));
  }
  fuse_unk_ = fields.get_bool(*model, "fuse_unk", false, "model");
  byte_fallback_ = fields.get_bool(*model, "byte_fallback", false, "model");
  ignore_merges_ = fields.get_bool(*model, "ignore_merges", false, "model");
  if (const json* u = JsonFields::member(*model, "unk_token"); u && !u->is_null()) {
    if (!u->is_string()) fields.fail("model.unk_token must be a string or null");
    has_unk_ = true;
    unk_token_ = u->get<std::string>();
  }
}

void BpeModel::build_tables(const std::vector<std::string>& pieces) {
  cp_to_id_.assign(0x110000, -1);
  byte_ids_.fill(-1);
  std::vector<bool> unsafe(0x110000, false);
  static const std::string kMeta = "\xE2\x96\x81";
  for (int32_t id = 0; id < static_cast<int32_t>(pieces.size()); ++id) {
    const std::string& tok = pieces[id];  // "" for an id with no string: it adds nothing below
    uint32_t cp;
    size_t len = tok.empty() ? 0 : utf8_decode(reinterpret_cast<const unsigned char*>(tok.data()), tok.size(), cp);
    if (len != 0 && len == tok.size()) cp_to_id_[cp] = id;
    for (size_t p = tok.find(kMeta, 1); p != std::string::npos; p = tok.find(kMeta, p + 1)) {
      uint32_t before = last_code_point(std::string_view(tok).substr(0, p));
      if (before != kMetaspace && before < 0x110000) unsafe[before] = true;
    }
  }
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = vocab.find(fmt::format("<0x{:02X}>", b));
  }
  for (uint32_t cp = 0; cp < 0x110000; ++cp)
    if (unsafe[cp]) unsafe_before_metaspace_.push_back(cp);
  chunking_ = cp_to_id_[kMetaspace] >= 0;
  if (has_unk_) {
    unk_id_ = vocab.find(unk_token_);
  }
}

void BpeModel::add_merges(const std::vector<std::pair<std::string, std::string>>& merges, const JsonFields& fields) {
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    const int32_t ia = vocab.find(a), ib = vocab.find(b);
    if (ia < 0) fields.fail(fmt::format("model.merges[{}]: \"{}\" is not in model.vocab", i, a));
    if (ib < 0) fields.fail(fmt::format("model.merges[{}]: \"{}\" is not in model.vocab", i, b));
    joined.assign(a).append(b);
    const int32_t ij = vocab.find(joined);
    if (ij < 0) fields.fail(fmt::format("model.merges[{}]: the merged token \"{}\" is not in model.vocab", i, joined));
    merges_.insert(ia, ib, {static_cast<uint32_t>(i), ij});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding

void BpeModel::tokenize_chunk_uncached(std::string_view w, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<HeapItem> heap;
  sym.clear();
  heap.clear();
  auto add = [&](int32_t id, uint32_t len) {
    int32_t n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };

  // Initial symbols (tokenizers' BPE::merge_word).
  const auto* p = reinterpret_cast<const unsigned char*>(w.data());
  bool pending_unk = false;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < w.size();) {
    uint32_t cp;
    size_t len = utf8_decode(p + i, w.size() - i, cp);
    int32_t id = -1;
    if (len == 0) len = 1;  // invalid UTF-8: a byte of its own, never a vocabulary string
    else id = cp_to_id_[cp];
    if (id >= 0) {
      if (pending_unk) add(unk_id_, unk_len), pending_unk = false;
      add(id, static_cast<uint32_t>(len));
      i += len;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = 0; k < len; ++k) all = all && byte_ids_[p[i + k]] >= 0;
      if (all) {
        for (size_t k = 0; k < len; ++k) add(byte_ids_[p[i + k]], 1);
        i += len;
        continue;
      }
    }
    if (has_unk_) {
      if (unk_id_ < 0)
        throw Error(fmt::format("{}: model.unk_token \"{}\" is not in model.vocab (needed to encode this text)",
                                source_, unk_token_));
      if (pending_unk && fuse_unk_) {
        unk_len += static_cast<uint32_t>(len);
      } else {
        if (pending_unk) add(unk_id_, unk_len);
        pending_unk = true;
        unk_len = static_cast<uint32_t>(len);
      }
    }
    i += len;
  }
  if (pending_unk) add(unk_id_, unk_len);

  merge_all(sym, heap, merges_);
  for (const Symbol& s : sym)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::tokenize_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (chunk.size() > kMaxCachedChunk) {
    tokenize_chunk_uncached(chunk, out);
    return;
  }
  const size_t h = StringHash{}(chunk);
  CacheShard& shard = cache_[(h >> 7) % kCacheShards];
  {
    std::lock_guard lock(shard.mu);
    auto it = shard.map.find(chunk);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  tokenize_chunk_uncached(chunk, out);
  std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  std::lock_guard lock(shard.mu);
  if (shard.map.size() >= kCacheEntriesPerShard) shard.map.clear();
  shard.map.emplace(std::string(chunk), std::move(ids));
}

void BpeModel::tokenize(std::string_view w, std::vector<int32_t>& out) const {
  if (w.empty()) return;
  if (ignore_merges_) {
    if (int32_t id = vocab.find(w); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (!chunking_) {
    tokenize_chunk(w, out);
    return;
  }
  // Cut before each "▁" whose preceding character can never be merged with it (see chunking_).
  const auto* p = reinterpret_cast<const unsigned char*>(w.data());
  size_t start = 0;
  uint32_t prev = kMetaspace;  // the character before position i (kMetaspace: none, or not a boundary)
  for (size_t i = 0; i < w.size();) {
    uint32_t cp;
    size_t len = utf8_decode(p + i, w.size() - i, cp);
    if (len == 0) {  // invalid byte: never cut after it
      prev = kMetaspace;
      i += 1;
      continue;
    }
    if (cp == kMetaspace && prev != kMetaspace && cp_to_id_[prev] >= 0 &&
        !std::binary_search(unsafe_before_metaspace_.begin(), unsafe_before_metaspace_.end(), prev)) {
      tokenize_chunk(w.substr(start, i - start), out);
      start = i;
    }
    prev = cp;
    i += len;
  }
  tokenize_chunk(w.substr(start), out);
}

void BpeModel::clear_cache() const {
  for (auto& shard : cache_) {
    std::lock_guard lock(shard.mu);
    shard.map.clear();
  }
}

}  // namespace qs::text
