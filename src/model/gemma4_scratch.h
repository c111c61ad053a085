#pragma once
// The activations and buffers of one Gemma4Model forward call (private to the model's own .cc files).
#include <algorithm>
#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "model/gemma4.h"

namespace qs {

// Activations of one forward call: rows are tokens, of one or several sequences. Each calling thread keeps one and
// reuses it, so that a decode step allocates nothing once the buffers have their sizes (only the logits it returns).
struct Gemma4Model::Scratch {
  struct Sequence {
    const KvCache* cache;  // read
    KvCache* appends_to;   // this call's K/V go there (nullptr: a decoder over another model's K/V)
    int64_t start;      // position of its first token in this call
    int64_t first_row;  // its first row in this call's K/V buffers
    int64_t tokens;
    std::span<const int32_t> ids;  // its tokens, for the cache's prefix keys
    int64_t tentative;             // the last of them that are unverified drafts
    const LoraAdapter* lora = nullptr;  // the adapter its linears add (nullptr: the base alone)
  };
  std::vector<Sequence> seqs;
  bool any_lora = false;  // some sequence has an adapter (gemma4_lora.cc)
  // Rows of this call grouped by adapter, for the linear being adapted: [adapter, rows].
  std::vector<std::pair<const LoraAdapter*, std::vector<int64_t>>> lora_groups;
  std::vector<int64_t> rows_pos;     // position of each row still being computed
  std::vector<int32_t> rows_seq;     // its sequence
  // Only when a call has soft tokens: each row's soft token embedding (nullptr: its token's), and the first and
  // last position of the block each row belongs to (an image's, where attention over it is bidirectional; else
  // the row's own position).
  std::vector<const float*> rows_soft;
  std::vector<int64_t> rows_block_first, rows_block_last;
  // forward_over_context: each row reads only the K/V before its position, from the cache.
  bool context_only = false;
  std::vector<float> h;              // hidden state [rows, H]
  std::vector<float> ple;            // per-layer inputs [rows, L, Dp]
  std::vector<std::vector<float>> k, v;  // K/V of every row of this call, for each layer that computes them
  // The same rows as the cache stores them (encode_kv_rows), for sequences whose cache holds bf16 or int8: attention
  // reads this call's rows exactly as it reads the cache's (the same values, and the same kernels' arithmetic), so a
  // position's logits do not depend on which call computed the rows it attends over.
  std::vector<std::vector<std::byte>> k_coded, v_coded;
  std::vector<float> x, q, attn, a, b, c, moe, cos, sin;  // temporaries
  std::vector<int32_t> tokens;        // every sequence's tokens of this call, in row order
  std::vector<int64_t> wanted_rows;   // rows whose logits are returned, in order
  std::vector<int64_t> kept_pos;
  std::vector<int32_t> kept_seq;
  struct Expert {
    int64_t expert;
    int64_t first;  // its first routed row in Moe's x, gate, up and down
  };
  struct Moe {  // the mixture of experts' temporaries
    std::vector<float> router_in, logits, prob, y;
    std::vector<int64_t> order;
    std::vector<std::vector<std::pair<int64_t, float>>> chosen;  // expert -> (row, weight)
    std::vector<Expert> work;  // the first `used` are this layer's chosen experts
    size_t used = 0;
    // Every routed (row, expert) pair's input, gate, up and down rows, expert after expert: rows x top_k of each,
    // whichever experts the rows choose, so that their sizes follow the batch alone.
    std::vector<float> x, gate, up, down;
    std::vector<LinearJob> jobs;
  } experts;

  // Attention's buffers, one per thread that may run a chunk of its jobs at once (the pool's size), claimed per
  // chunk. The calling thread sizes them all, so that which worker runs what never decides whether memory is
  // allocated.
  struct AttentionSlot {
    std::atomic<bool> busy{false};
    std::vector<KvSegment> segments;
    std::vector<float> scores;
  };
  std::unique_ptr<AttentionSlot[]> attention_slots;
  size_t attention_slot_count = 0;

  // Room in every slot for `segments` segments and `scores` floats.
  void reserve_attention(size_t threads, size_t segments, size_t scores) {
    if (attention_slot_count < threads) {
      attention_slots = std::make_unique<AttentionSlot[]>(threads);
      attention_slot_count = threads;
    }
    for (size_t i = 0; i < attention_slot_count; ++i) {
      if (attention_slots[i].segments.capacity() < segments) attention_slots[i].segments.reserve(segments);
      if (attention_slots[i].scores.capacity() < scores) attention_slots[i].scores.reserve(scores);
    }
  }
  // A free slot: at most attention_slot_count chunks run at once, so one is always free.
  AttentionSlot& claim_attention_slot() {
    for (;;)
      for (size_t i = 0; i < attention_slot_count; ++i)
        if (!attention_slots[i].busy.exchange(true, std::memory_order_acquire)) return attention_slots[i];
  }
  struct ClaimedSlot {  // one slot for a scope, released however the scope ends
    AttentionSlot& slot;
    explicit ClaimedSlot(Scratch& s) : slot(s.claim_attention_slot()) {}
    ~ClaimedSlot() { slot.busy.store(false, std::memory_order_release); }
    ClaimedSlot(const ClaimedSlot&) = delete;
    ClaimedSlot& operator=(const ClaimedSlot&) = delete;
  };

  // Ready for a new call: nothing of the last one counts, every buffer keeps its memory.
  void reset(int64_t layers, bool reads_context_only = false) {
    context_only = reads_context_only;
    any_lora = false;
    seqs.clear(), rows_pos.clear(), rows_seq.clear(), tokens.clear(), wanted_rows.clear(), ple.clear();
    rows_soft.clear(), rows_block_first.clear(), rows_block_last.clear();
    k.resize(layers), v.resize(layers), k_coded.resize(layers), v_coded.resize(layers);
  }

  // Rows up to `rows` that are no image's: their block is their own position.
  void extend_blocks(int64_t rows) {
    while (static_cast<int64_t>(rows_block_last.size()) < rows) {
      rows_block_first.push_back(rows_pos[rows_block_first.size()]);
      rows_block_last.push_back(rows_pos[rows_block_last.size()]);
    }
  }

  // Keeps only the given rows (ascending), e.g. the ones whose logits are wanted.
  void keep_rows(const std::vector<int64_t>& rows, int64_t H, int64_t ple_row) {
    auto pick = [&](std::vector<float>& m, int64_t width) {
      if (m.empty()) return;
      for (size_t i = 0; i < rows.size(); ++i) std::copy_n(m.data() + rows[i] * width, width, m.data() + i * width);
      m.resize(rows.size() * width);
    };
    pick(h, H);
    pick(ple, ple_row);
    kept_pos.clear(), kept_seq.clear();
    for (int64_t r : rows) kept_pos.push_back(rows_pos[r]), kept_seq.push_back(rows_seq[r]);
    rows_pos.swap(kept_pos);
    rows_seq.swap(kept_seq);
    for (auto* block : {&rows_block_first, &rows_block_last}) {
      if (block->empty()) continue;
      for (size_t i = 0; i < rows.size(); ++i) (*block)[i] = (*block)[rows[i]];
      block->resize(rows.size());
    }
  }
};

}  // namespace qs
