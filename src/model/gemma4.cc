// The Gemma 4 text forward pass. Names follow transformers' modeling_gemma4.py; in BF16 precision every
// activation is rounded where the bf16 reference model rounds it (after each op), so both agree closely.
#include "model/gemma4.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <memory>
#include <numeric>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/gemma4_scratch.h"
#include "model/lora_experts.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {

void Gemma4Model::round(std::span<float> x) const {
  if (!rounds_to_bf16()) return;
  // Element by element, so a step's logits (a megabyte a stream) are split over the pool instead of one thread
  // rounding them while the others wait.
  if (x.size() < kSplitElements) return round_to_bf16(x);
  pool_->parallel_for(x.size(), kSplitElements / 4, [&](size_t i0, size_t i1) { round_to_bf16(x.subspan(i0, i1 - i0)); });
}

void Gemma4Model::linear(Scratch& s, const LinearWeight& w, const std::vector<float>& x, int64_t rows,
                         std::vector<float>& y) const {
  linears(s, {{&w, &y}}, x, rows);
}

void Gemma4Model::linears(Scratch& s, std::initializer_list<std::pair<const LinearWeight*, std::vector<float>*>> wy,
                          const std::vector<float>& x, int64_t rows) const {
  std::array<LinearJob, kMaxLinears> jobs;
  if (wy.size() > kMaxLinears) throw Error("linears: more weights than one call takes");
  size_t n = 0;
  for (auto [weight, out] : wy) {
    out->resize(rows * weight->out);
    jobs[n++] = {weight, x.data(), rows, out->data()};
  }
  run(std::span(jobs.data(), n));
  if (s.any_lora)
    for (auto [weight, out] : wy) add_lora(s, *weight, x.data(), rows, out->data());
}

void Gemma4Model::run(std::span<const LinearJob> jobs) const {
  linear_forward(jobs, *pool_, activations_of(precision_));
  for (const LinearJob& j : jobs) round({j.y, size_t(j.T * j.w->out)});
}

void Gemma4Model::norm(std::vector<float>& x, int64_t n, const std::vector<float>& weight) const {
  rms_norm(x.data(), static_cast<int64_t>(x.size()) / n, n, weight.empty() ? nullptr : weight.data(),
           static_cast<float>(config_.text.rms_norm_eps));
  round(x);
}

std::vector<float> Gemma4Model::apply_linear(const LinearWeight& w, std::span<const float> x, int64_t rows) const {
  std::vector<float> y(rows * w.out);
  const LinearJob job{&w, x.data(), rows, y.data()};
  run(std::span(&job, 1));
  return y;
}

void Gemma4Model::token_embeddings(std::span<const int32_t> tokens, std::vector<float>& out) const {
  const int64_t T = tokens.size(), H = config_.text.hidden_size;
  // transformers casts sqrt(hidden) to the weights' dtype: sqrt(1536) = 39.19 becomes 39.25 in bf16.
  float scale = std::sqrt(static_cast<float>(H));
  if (rounds_to_bf16()) scale = round_to_bf16(scale);
  out.resize(T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      out[t * H + i] = bf16_to_f32(load_unaligned<uint16_t>(embed_tokens_ + (int64_t(tokens[t]) * H + i) * 2)) * scale;
  round(out);
}

void Gemma4Model::embed(std::span<const int32_t> tokens, Scratch& s) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t T = tokens.size(), H = c.hidden_size;
  token_embeddings(tokens, s.h);
  for (size_t t = 0; t < s.rows_soft.size(); ++t)  // masked_scatter: soft tokens replace the placeholders' rows
    if (s.rows_soft[t]) std::copy_n(s.rows_soft[t], H, s.h.data() + t * H);
  round(s.h);
  if (!c.has_ple()) return;

  // Per-layer inputs: (RMSNorm(proj(h) / sqrt(H)) + E_ple[token] * sqrt(Dp)) / sqrt(2), one Dp slice per layer.
  const int64_t L = c.num_hidden_layers, Dp = c.hidden_size_per_layer_input;
  linear(s, per_layer_model_projection_, s.h, T, s.ple);
  for (float& v : s.ple) v *= std::pow(static_cast<float>(H), -0.5f);
  round(s.ple);
  norm(s.ple, Dp, per_layer_projection_norm_);
  float ple_scale = std::sqrt(static_cast<float>(Dp));  // also cast to the weights' dtype
  if (rounds_to_bf16()) ple_scale = round_to_bf16(ple_scale);
  for (int64_t t = 0; t < T; ++t) {
    const std::byte* row = embed_tokens_per_layer_ + int64_t(tokens[t]) * L * Dp * 2;  // gathered from the map
    for (int64_t i = 0; i < L * Dp; ++i) {
      float token_part = bf16_to_f32(load_unaligned<uint16_t>(row + i * 2)) * ple_scale;
      if (rounds_to_bf16()) token_part = round_to_bf16(token_part);
      float sum = s.ple[t * L * Dp + i] + token_part;
      if (rounds_to_bf16()) sum = round_to_bf16(sum);
      s.ple[t * L * Dp + i] = sum * std::pow(2.0f, -0.5f);
    }
  }
  round(s.ple);
}

namespace {

// Where a row's K holds at least this many values (1024 positions of E2B's 512-wide full layers), a (row, KV head)
// pair's query heads are never split between threads, each reading all its K and V: the pair runs whole on one
// thread, or on every thread (attend_split). Below, the split's three hand-offs cost more than the reads they save
// (measured on E2B's 512-position sliding layers; a tiny model's 32-wide heads would split at 16K positions).
constexpr int64_t kSplitAttentionValues = 1024 * 512;

// Keys and values of the positions a layer attends over: this call's tokens from `chunk` (rows as
// encode_kv_rows writes them, f32 ones as they are), earlier ones from the paged cache of the layer that owns them.
struct KvView {
  const std::byte *chunk_k, *chunk_v;
  KvDtype chunk_dtype;
  const KvCache* cache;
  int64_t layer, chunk_start, kv_heads, head_dim;

  // Positions [first, last] of one KV head as runs of rows at a fixed stride: one per cache block, one for this
  // call's rows.
  void segments(int64_t first, int64_t last, int64_t kv_head, std::vector<KvSegment>& out) const {
    out.clear();
    if (first < chunk_start) {
      const int64_t block_size = cache->layout().block_size;
      for (int64_t p = first, end = std::min(last + 1, chunk_start); p < end;) {
        const int64_t n = std::min(end, (p / block_size + 1) * block_size) - p;
        out.push_back(cache->segment(layer, kv_head, p, n));
        p += n;
      }
    }
    if (last >= chunk_start) {
      const int64_t p = std::max(first, chunk_start);
      const int64_t stride = static_cast<int64_t>(kv_row_bytes(chunk_dtype, kv_heads, head_dim));
      const int64_t value_bytes = chunk_dtype == KvDtype::F32 ? 4 : chunk_dtype == KvDtype::BF16 ? 2 : 1;
      const int64_t offset = (p - chunk_start) * stride + kv_head * head_dim * value_bytes;
      KvSegment own{chunk_k + offset, chunk_v + offset, stride, last - p + 1, chunk_dtype};
      if (chunk_dtype == KvDtype::Int8) {  // the scales follow the row's codes, one f32 a head
        const int64_t scale = (p - chunk_start) * stride + kv_heads * head_dim + kv_head * int64_t(sizeof(float));
        own.k_scale = chunk_k + scale, own.v_scale = chunk_v + scale;
      }
      own.position = p;
      out.push_back(own);
    }
  }
};

void rope_tables(const std::vector<float>& inv_freq, int64_t pos, bool bf16, float* cos, float* sin) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    float angle = static_cast<float>(pos) * inv_freq[i];
    cos[i] = bf16 ? round_to_bf16(std::cos(angle)) : std::cos(angle);
    sin[i] = bf16 ? round_to_bf16(std::sin(angle)) : std::sin(angle);
  }
}

// x * cos + rotate_half(x) * sin for every row (token) and head, at each row's position; cos and sin are buffers.
void rope(std::vector<float>& x, const std::vector<int64_t>& pos, int64_t heads, int64_t d,
          const std::vector<float>& inv_freq, bool bf16, std::vector<float>& cos, std::vector<float>& sin) {
  cos.resize(d / 2), sin.resize(d / 2);
  for (size_t t = 0; t < pos.size(); ++t) {
    rope_tables(inv_freq, pos[t], bf16, cos.data(), sin.data());
    float* row = x.data() + t * heads * d;
    (bf16 ? apply_rope_bf16 : apply_rope)(row, heads, d, cos.data(), sin.data());
  }
}

}  // namespace

void Gemma4Model::attention(const Gemma4Layer& layer, int64_t l, Scratch& s) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t rows = s.rows_pos.size(), H = c.hidden_size, hd = layer.head_dim, nH = c.num_attention_heads;
  const int64_t kvh = layer.kv_heads, group = nH / kvh;
  const bool bf16 = rounds_to_bf16();
  const auto& inv_freq = layer.full_attention ? inv_freq_full_ : inv_freq_sliding_;

  s.x = s.h;
  norm(s.x, H, layer.input_norm);
  // All of this call's tokens reach a layer that computes K/V (no row has been dropped yet).
  std::vector<float>& k = s.k[l];
  std::vector<float>& v = s.v[l];
  if (!layer.computes_kv) linear(s, layer.q_proj, s.x, rows, s.q);
  else if (layer.v_proj.out)
    linears(s, {{&layer.q_proj, &s.q}, {&layer.k_proj, &k}, {&layer.v_proj, &v}}, s.x, rows);
  else linears(s, {{&layer.q_proj, &s.q}, {&layer.k_proj, &k}}, s.x, rows), v = k;  // attention_k_eq_v: V is raw k
  norm(s.q, hd, layer.q_norm);
  rope(s.q, s.rows_pos, nH, hd, inv_freq, bf16, s.cos, s.sin);
  if (layer.computes_kv) {
    norm(k, hd, layer.k_norm);
    rope(k, s.rows_pos, kvh, hd, inv_freq, bf16, s.cos, s.sin);
    norm(v, hd, {});  // weightless RMSNorm on V, never RoPE
    for (const auto& seq : s.seqs) {
      const KvDtype dtype = seq.cache->layout().dtype;
      if (dtype == KvDtype::F32) continue;
      const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(dtype, kvh, hd));
      for (auto [x, coded] : {std::pair(&k, &s.k_coded[l]), std::pair(&v, &s.v_coded[l])}) {
        coded->resize(rows * row_bytes);  // every sequence of a call shares its engine's dtype
        encode_kv_rows(dtype, coded->data() + seq.first_row * row_bytes, x->data() + seq.first_row * kvh * hd,
                       seq.tokens, kvh, hd);
      }
    }
  }

  const int64_t src = layer.kv_source;
  auto view = [&](int32_t sequence) {
    const auto& seq = s.seqs[sequence];
    if (s.context_only) return KvView{nullptr, nullptr, KvDtype::F32, seq.cache, src, seq.start, kvh, hd};
    const KvDtype dtype = seq.cache->layout().dtype;
    if (dtype == KvDtype::F32) {
      const int64_t first = seq.first_row * kvh * hd;
      auto rows = [&](const auto& x) { return reinterpret_cast<const std::byte*>(x[src].data() + first); };
      return KvView{rows(s.k), rows(s.v), dtype, seq.cache, src, seq.start, kvh, hd};
    }
    const int64_t first = seq.first_row * static_cast<int64_t>(kv_row_bytes(dtype, kvh, hd));
    return KvView{s.k_coded[src].data() + first, s.v_coded[src].data() + first, dtype, seq.cache, src, seq.start,
                  kvh, hd};
  };
  const int64_t window = layer.full_attention ? 0 : c.sliding_window;
  s.attn.resize(rows * nH * hd);
  // A job is one token's query heads of one KV head, a (row, KV head) pair (they read the same K/V rows), split
  // further when there are too few pairs to keep every thread busy. Over a long context (decode at depth) a pair's
  // K and V are read once instead: pairs run whole, one a job, as long as they fill every thread, and the rest,
  // fewer than the threads, each on every thread (attend_split; 32K positions, 2 threads: whole on one thread 5-6
  // ms a pair, split 3.9).
  int64_t longest_reach = window;
  if (!window)
    for (int64_t pos : s.rows_pos) longest_reach = std::max(longest_reach, pos + 1);
  const bool deep = longest_reach * hd >= kSplitAttentionValues;
  const int64_t pairs = rows * kvh, threads = pool_->size();
  const int64_t splits =
      deep ? 1 : std::clamp<int64_t>((2 * threads + pairs - 1) / std::max<int64_t>(1, pairs), 1, group);
  const int64_t heads_per_job = (group + splits - 1) / splits;
  const int64_t split_from = deep ? pairs - pairs % threads : pairs;  // the pairs from it run on every thread
  // Room for the longest context these sequences may reach: decode steps never grow the buffers as positions grow.
  size_t segments_room = 0, scores_room = 0;
  for (const auto& seq : s.seqs) {
    const int64_t longest = seq.cache->max_context();
    segments_room = std::max<size_t>(segments_room, longest / seq.cache->layout().block_size + 2);  // + this call's
    scores_room = std::max<size_t>(scores_room, heads_per_job * longest);
  }
  s.reserve_attention(threads, segments_room, scores_room);
  // The positions row t attends to: up to its own over the layer's window (a row over another model's context, an
  // assistant's, up to the position before it, over sliding_window + 1), an image block whole.
  auto attend_row = [&](int64_t t, int64_t kv_head, int64_t head, int64_t heads, bool split,
                        Scratch::AttentionSlot& slot) {
    const int64_t own = s.context_only ? s.rows_pos[t] - 1 : s.rows_pos[t];
    const int64_t reach = s.context_only ? window + 1 : window;
    // An image block: on sliding layers (gemma4), or on every layer and whatever the window (gemma4_unified).
    const bool block = !s.rows_block_last.empty() && (window || c.vision_blocks_on_all_layers);
    int64_t first = window ? std::max<int64_t>(0, own - reach + 1) : 0;
    if (block && c.vision_blocks_on_all_layers) first = std::min(first, s.rows_block_first[t]);
    const int64_t last = block ? s.rows_block_last[t] : own;
    view(s.rows_seq[t]).segments(first, last, kv_head, slot.segments);  // scaling is 1: q_norm and k_norm carry it
    const float* q = s.q.data() + (t * nH + head) * hd;
    float* out = s.attn.data() + (t * nH + head) * hd;
    if (split) attend_split(q, heads, hd, slot.segments, bf16, out, *pool_, slot.scores);
    else attend(q, heads, hd, slot.segments, bf16, out, slot.scores);
  };
  pool_->parallel_for(split_from * splits, 1, [&](size_t a, size_t b) {
    const Scratch::ClaimedSlot slot(s);
    for (size_t job = a; job < b; ++job) {
      const int64_t t = job / (kvh * splits), kv_head = job / splits % kvh;
      const int64_t head = kv_head * group + job % splits * heads_per_job;
      const int64_t heads = std::min(heads_per_job, (kv_head + 1) * group - head);
      if (heads > 0) attend_row(t, kv_head, head, heads, false, slot.slot);
    }
  });
  if (split_from < pairs) {
    const Scratch::ClaimedSlot slot(s);
    for (int64_t pair = split_from; pair < pairs; ++pair) {
      const int64_t t = pair / kvh, kv_head = pair % kvh;
      attend_row(t, kv_head, kv_head * group, group, true, slot.slot);
    }
  }
  round(s.attn);
  linear(s, layer.o_proj, s.attn, rows, s.a);
  norm(s.a, H, layer.post_attention_norm);
  for (size_t i = 0; i < s.h.size(); ++i) s.h[i] += s.a[i];
  round(s.h);
}

void Gemma4Model::feed_forward(const Gemma4Layer& layer, Scratch& s) const {
  const int64_t rows = s.rows_pos.size(), H = config_.text.hidden_size;
  // Dense MLP: down(gelu_tanh(gate(x)) * up(x)).
  s.x = s.h;
  norm(s.x, H, layer.pre_feedforward_norm);
  linears(s, {{&layer.gate_proj, &s.a}, {&layer.up_proj, &s.b}}, s.x, rows);
  gelu_tanh(s.a);
  round(s.a);
  for (size_t i = 0; i < s.a.size(); ++i) s.a[i] *= s.b[i];
  round(s.a);
  linear(s, layer.down_proj, s.a, rows, s.c);
  if (!layer.experts.empty()) {
    norm(s.c, H, layer.post_feedforward_norm_1);
    mixture_of_experts(layer, s, s.moe);
    norm(s.moe, H, layer.post_feedforward_norm_2);
    for (size_t i = 0; i < s.c.size(); ++i) s.c[i] += s.moe[i];
    round(s.c);
  }
  norm(s.c, H, layer.post_feedforward_norm);
  for (size_t i = 0; i < s.h.size(); ++i) s.h[i] += s.c[i];
  round(s.h);
}

// Experts beside the dense MLP. The router reads the raw residual: RMSNorm without weight, times router.scale
// and hidden^-0.5; softmax over all experts in f32, top-k, renormalised, then times per_expert_scale.
void Gemma4Model::mixture_of_experts(const Gemma4Layer& layer, Scratch& s, std::vector<float>& out) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t rows = s.rows_pos.size(), H = c.hidden_size, E = c.num_experts, K = c.top_k_experts;
  Scratch::Moe& m = s.experts;
  std::vector<float>& r = m.router_in;
  r = s.h;
  norm(r, H, {});
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < H; ++i) r[t * H + i] *= layer.router_scale[i];
  round(r);
  for (float& x : r) x *= std::pow(static_cast<float>(H), -0.5f);
  round(r);
  linear(s, layer.router_proj, r, rows, m.logits);

  m.chosen.resize(E);
  for (auto& rows_of : m.chosen) rows_of.clear(), rows_of.reserve(rows);  // room for every row, once
  std::vector<float>& prob = m.prob;
  std::vector<int64_t>& idx = m.order;
  for (int64_t t = 0; t < rows; ++t) {
    const float* z = m.logits.data() + t * E;
    float mx = *std::max_element(z, z + E), sum = 0;
    prob.resize(E);
    for (int64_t e = 0; e < E; ++e) sum += (prob[e] = std::exp(z[e] - mx));
    for (float& p : prob) p /= sum;
    idx.resize(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                      [&](int64_t a, int64_t b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; });
    float top_sum = 0;
    for (int64_t k = 0; k < K; ++k) top_sum += prob[idx[k]];
    for (int64_t k = 0; k < K; ++k)
      m.chosen[idx[k]].push_back({t, prob[idx[k]] / top_sum * layer.per_expert_scale[idx[k]]});
  }

  std::vector<float>& y = m.y;
  y = s.h;
  norm(y, H, layer.pre_feedforward_norm_2);
  // Every chosen expert's gate and up as one job, then every down as one: the experts' small matrices stream
  // back to back on every thread.
  const int64_t I = c.moe_intermediate_size, routed = rows * K;
  m.work.resize(E);
  m.jobs.reserve(2 * E);  // gate and up of every expert, at most: never grows after the first call
  size_t used = 0;
  for (int64_t e = 0, first = 0; e < E; ++e)
    if (!m.chosen[e].empty()) {
      m.work[used++] = {e, first};
      first += static_cast<int64_t>(m.chosen[e].size());
      const ExpertWeights& w = layer.experts[e];
      expert_bytes_read_.fetch_add(w.gate.bytes() + w.up.bytes() + w.down.bytes(), std::memory_order_relaxed);
    }
  const std::span work(m.work.data(), used);
  m.x.resize(routed * H), m.gate.resize(routed * I), m.up.resize(routed * I), m.down.resize(routed * H);
  m.jobs.clear();
  for (const Scratch::Expert& w : work) {
    const auto& rows_of = m.chosen[w.expert];
    const int64_t n = rows_of.size();
    for (int64_t j = 0; j < n; ++j) std::copy_n(y.data() + rows_of[j].first * H, H, m.x.data() + (w.first + j) * H);
    m.jobs.push_back({&layer.experts[w.expert].gate, m.x.data() + w.first * H, n, m.gate.data() + w.first * I});
    m.jobs.push_back({&layer.experts[w.expert].up, m.x.data() + w.first * H, n, m.up.data() + w.first * I});
  }
  m.used = used;
  run_experts(s, layer, ExpertParam::GateUp, m.x.data(), m.gate.data(), m.up.data());
  m.jobs.clear();
  gelu_tanh(m.gate);  // element-wise: the bits of each expert's rows on their own
  round(m.gate);
  for (size_t i = 0; i < m.gate.size(); ++i) m.gate[i] *= m.up[i];
  round(m.gate);
  for (const Scratch::Expert& w : work)
    m.jobs.push_back({&layer.experts[w.expert].down, m.gate.data() + w.first * I, int64_t(m.chosen[w.expert].size()),
                      m.down.data() + w.first * H});
  run_experts(s, layer, ExpertParam::Down, m.gate.data(), m.down.data(), nullptr);
  out.assign(rows * H, 0.0f);
  for (const Scratch::Expert& w : work) {  // expert-major, as transformers accumulates
    const auto& rows_of = m.chosen[w.expert];
    for (size_t j = 0; j < rows_of.size(); ++j) {
      float* o = out.data() + rows_of[j].first * H;
      for (int64_t i = 0; i < H; ++i) {
        float contribution = m.down[(w.first + j) * H + i] * rows_of[j].second;
        if (rounds_to_bf16()) contribution = round_to_bf16(contribution);
        o[i] = rounds_to_bf16() ? round_to_bf16(o[i] + contribution) : o[i] + contribution;
      }
    }
  }
}

void Gemma4Model::per_layer_input(const Gemma4Layer& layer, int64_t l, Scratch& s) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t rows = s.rows_pos.size(), H = c.hidden_size, Dp = c.hidden_size_per_layer_input;
  const int64_t L = c.num_hidden_layers;
  linear(s, layer.per_layer_input_gate, s.h, rows, s.a);
  gelu_tanh(s.a);
  round(s.a);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < Dp; ++i) s.a[t * Dp + i] *= s.ple[(t * L + l) * Dp + i];
  round(s.a);
  linear(s, layer.per_layer_projection, s.a, rows, s.b);
  norm(s.b, H, layer.post_per_layer_input_norm);
  for (size_t i = 0; i < s.h.size(); ++i) s.h[i] += s.b[i];
  round(s.h);
}

// A step's soft tokens: their rows, the pad token for the per-layer inputs there (as transformers does), and for
// images on a model with bidirectional vision attention, the block end each of their rows sees on sliding layers.
void Gemma4Model::place_soft_tokens(const SequenceStep& step, int64_t first_row, Scratch& s) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t H = c.hidden_size, T = step.tokens.size();
  s.rows_soft.resize(first_row + T, nullptr);
  int64_t next_free = 0;
  for (const SoftTokens& soft : step.soft_tokens) {
    const int64_t count = static_cast<int64_t>(soft.embeddings.size()) / H;
    if (count == 0 || count * H != static_cast<int64_t>(soft.embeddings.size()) || soft.first < next_free ||
        soft.first + count > T)
      throw Error(fmt::format("forward: soft tokens at {} ({} values) are not whole rows of {} inside the step's "
                              "{} tokens after the previous soft tokens",
                              soft.first, soft.embeddings.size(), H, T));
    next_free = soft.first + count;
    for (int64_t j = 0; j < count; ++j) {
      s.rows_soft[first_row + soft.first + j] = soft.embeddings.data() + j * H;
      s.tokens[first_row + soft.first + j] = static_cast<int32_t>(c.pad_token_id);
    }
    if (!soft.vision || !c.bidirectional_vision) continue;
    s.extend_blocks(first_row + T);
    for (int64_t j = 0; j < count; ++j) {
      s.rows_block_first[first_row + soft.first + j] = s.rows_pos[first_row + soft.first];
      s.rows_block_last[first_row + soft.first + j] = s.rows_pos[first_row + soft.first + count - 1];
    }
  }
}

void Gemma4Model::commit_kv(Scratch& s) const {
  for (const auto& seq : s.seqs)
    seq.appends_to->append(seq.ids, [&](int64_t l, int kv, int64_t j) {
      return (kv ? s.v[l] : s.k[l]).data() + (seq.first_row + j) * layers_[l].kv_heads * layers_[l].head_dim;
    }, seq.tentative);
}

// The final-normed hidden state of each step's wanted rows to the steps that ask for it (`h` holds every wanted row,
// step by step).
void Gemma4Model::copy_final_hidden(std::span<const SequenceStep> steps, std::span<const float> h, int64_t H) {
  int64_t row = 0;
  for (const SequenceStep& step : steps) {
    const int64_t rows = step.logits == LogitsWanted::All    ? static_cast<int64_t>(step.tokens.size())
                         : step.logits == LogitsWanted::Last ? 1
                                                             : 0;
    if (step.final_hidden) step.final_hidden->assign(h.begin() + row * H, h.begin() + (row + rows) * H);
    row += rows;
  }
}

void Gemma4Model::read_kv_of(const Gemma4Model& target) {
  const Gemma4TextConfig& c = config_.text;
  if (c.num_kv_shared_layers != c.num_hidden_layers)
    throw Error("read_kv_of: this decoder computes K/V of its own; only an assistant reads its target's");
  const Gemma4TextConfig& t = target.config().text;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Gemma4Layer& layer = layers_[l];
    const int64_t src = t.last_kv_layer(c.layer_types[l]);
    if (src < 0)
      throw Error(fmt::format("assistant layer {} ({}) reads the target's K/V of that type, but no target layer of "
                              "that type computes K/V",
                              l, layer_type_name(c.layer_types[l])));
    const Gemma4Layer& donor = target.layers_[src];
    if (donor.head_dim != layer.head_dim || donor.kv_heads != layer.kv_heads)
      throw Error(fmt::format("assistant layer {} ({}) expects K/V of {} heads x {} dims, but target layer {} stores "
                              "{} x {}",
                              l, layer_type_name(c.layer_types[l]), layer.kv_heads, layer.head_dim, src,
                              donor.kv_heads, donor.head_dim));
    layer.kv_source = src;
  }
  reads_target_kv_ = true;
}

std::vector<float> Gemma4Model::forward_over_context(std::span<const float> inputs, std::span<const int64_t> positions,
                                                     const KvCache& context) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t H = c.hidden_size, rows = positions.size();
  if (!reads_target_kv_) throw Error("forward_over_context: no target K/V to read (read_kv_of first)");
  if (static_cast<int64_t>(inputs.size()) != rows * H)
    throw Error(fmt::format("forward_over_context: {} input values for {} rows of {}", inputs.size(), rows, H));
  for (const Gemma4Layer& layer : layers_)
    if (layer.kv_source >= static_cast<int64_t>(context.layout().layer_class.size()) ||
        context.layout().layer_class[layer.kv_source] < 0)
      throw Error(fmt::format("forward_over_context: the cache holds no K/V of target layer {}: not the target's cache",
                              layer.kv_source));
  const bool sliding = std::any_of(layers_.begin(), layers_.end(), [](const Gemma4Layer& l) { return !l.full_attention; });
  const int64_t held = context.layout().first_live_position(context.length());
  for (int64_t p : positions) {
    if (p < 1 || p > context.length())
      throw Error(fmt::format("forward_over_context: a query at position {} reads positions before it, but the "
                              "target's cache holds 0..{}",
                              p, context.length() - 1));
    if (sliding && std::max<int64_t>(0, p - 1 - c.sliding_window) < held)
      throw Error(fmt::format("forward_over_context: a query at position {} reads sliding-layer K/V from position {}, "
                              "but the target's cache keeps them from {} on (create it with a wider sliding_kept)",
                              p, p - 1 - c.sliding_window, held));
  }
  thread_local Scratch scratch;
  Scratch& s = scratch;
  s.reset(c.num_hidden_layers, true);
  s.seqs.push_back({&context, nullptr, context.length(), 0, rows, {}, 0});
  s.rows_pos.assign(positions.begin(), positions.end());
  s.rows_seq.assign(rows, 0);
  s.h.assign(inputs.begin(), inputs.end());
  round(s.h);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Gemma4Layer& layer = layers_[l];
    attention(layer, l, s);
    feed_forward(layer, s);
    for (float& x : s.h) x *= layer.layer_scalar;
    round(s.h);
  }
  norm(s.h, H, final_norm_);
  return s.h;
}

std::vector<float> Gemma4Model::forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits) const {
  SequenceStep step{tokens, &cache, all_logits ? LogitsWanted::All : LogitsWanted::Last};
  return forward_batch(std::span(&step, 1));
}

std::vector<float> Gemma4Model::forward_batch(std::span<const SequenceStep> steps) const {
  const Gemma4TextConfig& c = config_.text;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  if (reads_target_kv_ || config_.assistant)
    throw Error("forward: an assistant drafter computes no K/V of its own; load it with --assistant beside its "
                "target");
  thread_local Scratch scratch;
  Scratch& s = scratch;
  s.reset(c.num_hidden_layers);
  std::vector<int32_t>& tokens = s.tokens;
  std::vector<int64_t>& wanted_rows = s.wanted_rows;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceStep& step = steps[i];
    const int64_t T = step.tokens.size(), start = step.cache->length();
    if (T == 0) throw Error("forward: a sequence with no tokens");
    if (start + T > step.cache->max_context())
      throw Error(fmt::format("the sequence needs {} positions but the context holds {} ({} already used)",
                              start + T, step.cache->max_context(), start));
    for (int32_t id : step.tokens)
      if (id < 0 || id >= V || (c.has_ple() && id >= c.vocab_size_per_layer_input))
        throw Error(fmt::format("token id {} is outside the vocabulary (0..{})", id, V - 1));
    step.cache->check_room(T, step.tentative);
    s.seqs.push_back({step.cache, step.cache, start, static_cast<int64_t>(tokens.size()), T, step.tokens,
                      step.tentative, step.lora});
    s.any_lora |= step.lora != nullptr;
    for (int64_t t = 0; t < T; ++t) {
      s.rows_pos.push_back(start + t);
      s.rows_seq.push_back(static_cast<int32_t>(i));
      const int64_t row = static_cast<int64_t>(tokens.size()) + t;
      if (step.logits == LogitsWanted::All || (step.logits == LogitsWanted::Last && t == T - 1))
        wanted_rows.push_back(row);
    }
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
    if (!step.soft_tokens.empty()) place_soft_tokens(step, static_cast<int64_t>(tokens.size()) - T, s);
  }
  if (!s.rows_soft.empty()) s.rows_soft.resize(tokens.size(), nullptr);
  if (!s.rows_block_last.empty()) s.extend_blocks(static_cast<int64_t>(tokens.size()));  // later rows: causal
  embed(tokens, s);
  const int64_t ple_row = c.num_hidden_layers * c.hidden_size_per_layer_input;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    // From the first KV-shared layer on nothing feeds a cache: only the rows whose logits are wanted matter.
    if (l == c.first_shared_layer() && c.num_kv_shared_layers > 0 && wanted_rows.size() < s.rows_pos.size()) {
      s.keep_rows(wanted_rows, H, ple_row);
      std::iota(wanted_rows.begin(), wanted_rows.end(), 0);
    }
    const Gemma4Layer& layer = layers_[l];
    attention(layer, l, s);
    feed_forward(layer, s);
    if (c.has_ple()) per_layer_input(layer, l, s);
    for (float& x : s.h) x *= layer.layer_scalar;
    round(s.h);
  }
  commit_kv(s);
  if (wanted_rows.size() < s.rows_pos.size()) s.keep_rows(wanted_rows, H, ple_row);
  if (s.h.empty()) return {};

  const int64_t rows = s.h.size() / H;
  norm(s.h, H, final_norm_);
  copy_final_hidden(steps, s.h, H);
  std::vector<float> logits;
  linear(s, lm_head_, s.h, rows, logits);
  if (c.final_logit_softcapping > 0) {
    const float cap = static_cast<float>(c.final_logit_softcapping);
    const bool bf16 = rounds_to_bf16();
    // Element by element, so split over the pool: a megabyte of logits a stream.
    pool_->parallel_for(logits.size(), kSplitElements / 4, [&](size_t i0, size_t i1) {
      const std::span<float> part(logits.data() + i0, i1 - i0);
      for (float& z : part) z = bf16 ? round_to_bf16(z / cap) : z / cap;
      qs::tanh(part);
      for (float& z : part) z = (bf16 ? round_to_bf16(z) : z) * cap;
      round(part);
    });
  }
  return logits;
}

}  // namespace qs
