// The Gemma 4 vision encoder's forward pass and loading. In BF16 precision every activation is rounded where
// transformers' bf16 model rounds it; the pooler and the standardization run in f32 there too, as in transformers.
#include "model/gemma4_vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/gemma4_multimodal_embedder.h"
#include "model/lora_adapter.h"
#include "model/weight_reader.h"
#include "util/error.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace {

const std::string kTower = "model.vision_tower.";

ClippableLinear load_clippable(WeightReader& r, const std::string& module, int64_t out, int64_t in, bool clipped) {
  ClippableLinear c{r.linear(module + ".linear", out, in), module + ".linear"};
  if (clipped) {
    c.input_min = r.vector(module + ".input_min", {})[0];
    c.input_max = r.vector(module + ".input_max", {})[0];
    c.output_min = r.vector(module + ".output_min", {})[0];
    c.output_max = r.vector(module + ".output_max", {})[0];
  }
  return c;
}

Gemma4VisionLayer load_layer(WeightReader& r, const Gemma4VisionConfig& v, const std::string& p) {
  const int64_t D = v.hidden_size, hd = v.head_dim, q = v.num_attention_heads * hd, kv = v.num_key_value_heads * hd;
  const int64_t I = v.intermediate_size;
  const bool clip = v.use_clipped_linears;
  Gemma4VisionLayer L;
  L.input_norm = r.vector(p + "input_layernorm.weight", {D});
  L.post_attention_norm = r.vector(p + "post_attention_layernorm.weight", {D});
  L.pre_feedforward_norm = r.vector(p + "pre_feedforward_layernorm.weight", {D});
  L.post_feedforward_norm = r.vector(p + "post_feedforward_layernorm.weight", {D});
  L.q_proj = load_clippable(r, p + "self_attn.q_proj", q, D, clip);
  L.k_proj = load_clippable(r, p + "self_attn.k_proj", kv, D, clip);
  L.v_proj = load_clippable(r, p + "self_attn.v_proj", kv, D, clip);
  L.o_proj = load_clippable(r, p + "self_attn.o_proj", D, q, clip);
  L.q_norm = r.vector(p + "self_attn.q_norm.weight", {hd});
  L.k_norm = r.vector(p + "self_attn.k_norm.weight", {hd});
  L.gate_proj = load_clippable(r, p + "mlp.gate_proj", I, D, clip);
  L.up_proj = load_clippable(r, p + "mlp.up_proj", I, D, clip);
  L.down_proj = load_clippable(r, p + "mlp.down_proj", D, I, clip);
  return L;
}

void clamp(std::span<float> x, float lo, float hi) {
  if (std::isinf(lo) && std::isinf(hi)) return;
  for (float& v : x) v = std::clamp(v, lo, hi);
}

}  // namespace

// Activations of one image: rows are its real patches.
struct Gemma4VisionTower::Scratch {
  int64_t patches = 0;
  std::vector<int32_t> px, py;  // each patch's position on the grid
  std::vector<float> h, x, q, k, v, attn, a, b, c;
  const LoraAdapter* lora = nullptr;  // the sequence's adapter, when it adapts the tower
};

std::unique_ptr<Gemma4VisionTower> Gemma4VisionTower::load(const Gemma4Model& text) {
  return load(text.checkpoint(), text.config(), text.precision());
}

std::unique_ptr<Gemma4VisionTower> Gemma4VisionTower::load(const Checkpoint& checkpoint, const ModelConfig& mc,
                                                           Precision precision) {
  if (!mc.vision)
    throw Error(fmt::format("{}: config.json has no vision_config: the model reads no images",
                            checkpoint.dir().string()));
  auto t = std::unique_ptr<Gemma4VisionTower>(new Gemma4VisionTower());
  const Gemma4VisionConfig& v = t->config_ = *mc.vision;
  t->text_hidden_ = mc.text.hidden_size;
  t->precision_ = precision;
  t->pool_ = &ThreadPool::shared();
  Progress progress("load vision tower", 0, false);
  WeightReader r(checkpoint, mc, t->int4_storage_, *t->pool_, progress,
                 precision == Precision::F32 ? Activations::F32 : Activations::BF16);
  const int64_t D = v.hidden_size;
  t->input_proj_ = {r.linear(kTower + "patch_embedder.input_proj", D, v.patch_values()),
                    kTower + "patch_embedder.input_proj"};
  t->position_embedding_table_ =
      r.vector(kTower + "patch_embedder.position_embedding_table", {2, v.position_embedding_size, D});
  for (int64_t l = 0; l < v.num_hidden_layers; ++l)
    t->layers_.push_back(load_layer(r, v, fmt::format("{}encoder.layers.{}.", kTower, l)));
  if (v.standardize) {
    t->std_bias_ = r.vector(kTower + "std_bias", {D});
    t->std_scale_ = r.vector(kTower + "std_scale", {D});
  }
  t->embed_vision_ = Gemma4MultimodalEmbedder::load(r, "model.embed_vision.", D, mc.text.hidden_size, v.rms_norm_eps);
  t->int4_ = r.int4();
  t->weight_bytes_ = r.bytes() + (t->position_embedding_table_.size() + t->std_bias_.size() * 2) * 2;
  // Gemma4VisionRotaryEmbedding: theta^(-2i / (head_dim / 2)) for i < head_dim / 4, for x and for y alike.
  const int64_t spatial = v.head_dim / 2;
  for (int64_t i = 0; i < spatial / 2; ++i)
    t->inv_freq_.push_back(1.0f / std::pow(static_cast<float>(v.rope_theta),
                                           static_cast<float>(2 * i) / static_cast<float>(spatial)));
  return t;
}

void Gemma4VisionTower::round(std::span<float> x) const {
  if (precision_ != Precision::F32) round_to_bf16(x);
}

void Gemma4VisionTower::norm(std::vector<float>& x, int64_t n, const std::vector<float>& weight) const {
  rms_norm(x.data(), static_cast<int64_t>(x.size()) / n, n, weight.empty() ? nullptr : weight.data(),
           static_cast<float>(config_.rms_norm_eps));
  round(x);
}

// Linears of one input as one job; a clipped linear reads its own clamped copy of the input. An adapter's low-rank
// product joins the inner linear's output, before the output clamp: PEFT wraps the inner nn.Linear.
void Gemma4VisionTower::linears(std::initializer_list<std::pair<const ClippableLinear*, std::vector<float>*>> wy,
                                std::vector<float>& x, int64_t rows, const LoraAdapter* lora) const {
  thread_local std::array<std::vector<float>, 3> clamped;
  std::array<LinearJob, 3> jobs;
  size_t n = 0;
  for (auto [w, y] : wy) {
    const float* input = x.data();
    if (!std::isinf(w->input_min) || !std::isinf(w->input_max)) {
      clamped[n] = x;
      clamp(clamped[n], w->input_min, w->input_max);
      input = clamped[n].data();
    }
    y->resize(rows * w->linear.out);
    jobs[n++] = {&w->linear, input, rows, y->data()};
  }
  linear_forward(std::span(jobs.data(), n), *pool_,
                 precision_ == Precision::F32 ? Activations::F32 : Activations::BF16);
  size_t j = 0;
  for (auto [w, y] : wy) {
    round(*y);
    if (const LoraWeights* lw = lora ? lora->find_tower(w->module) : nullptr)
      lw->add_to(jobs[j].x, all_rows(rows), y->data(), precision_ != Precision::F32, *pool_);
    clamp(*y, w->output_min, w->output_max);
    ++j;
  }
}

// Gemma4VisionRotaryEmbedding + apply_multidimensional_rope: each head's first half rotates by the patch's x, its
// second half by its y, each half as rotate_half pairs over head_dim / 4 frequencies.
void Gemma4VisionTower::rope(std::vector<float>& x, int64_t heads, const Scratch& s) const {
  const int64_t hd = config_.head_dim, half = hd / 2, n = half / 2;
  const bool bf16 = precision_ != Precision::F32;
  std::vector<float> cos(2 * n), sin(2 * n);  // x frequencies, then y
  for (int64_t t = 0; t < s.patches; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      const float ax = static_cast<float>(s.px[t]) * inv_freq_[i], ay = static_cast<float>(s.py[t]) * inv_freq_[i];
      cos[i] = std::cos(ax), sin[i] = std::sin(ax), cos[n + i] = std::cos(ay), sin[n + i] = std::sin(ay);
    }
    if (bf16) round_to_bf16(cos), round_to_bf16(sin);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data() + (t * heads + h) * hd;
      (bf16 ? apply_rope_bf16 : apply_rope)(v, 1, half, cos.data(), sin.data());
      (bf16 ? apply_rope_bf16 : apply_rope)(v + half, 1, half, cos.data() + n, sin.data() + n);
    }
  }
}

void Gemma4VisionTower::attention(const Gemma4VisionLayer& layer, Scratch& s) const {
  const Gemma4VisionConfig& c = config_;
  const int64_t P = s.patches, hd = c.head_dim, nH = c.num_attention_heads, kvh = c.num_key_value_heads;
  const int64_t group = nH / kvh;
  const bool bf16 = precision_ != Precision::F32;
  s.x = s.h;
  norm(s.x, c.hidden_size, layer.input_norm);
  linears({{&layer.q_proj, &s.q}, {&layer.k_proj, &s.k}, {&layer.v_proj, &s.v}}, s.x, P, s.lora);
  norm(s.q, hd, layer.q_norm);
  rope(s.q, nH, s);
  norm(s.k, hd, layer.k_norm);
  rope(s.k, kvh, s);
  norm(s.v, hd, {});  // v_norm: no weight
  // Every patch attends to every patch of the image (scaling 1: q_norm and k_norm carry it).
  s.attn.resize(P * nH * hd);
  // Jobs of kTile patches of one KV head: their query heads share each pass over that head's keys and values.
  constexpr int64_t kTile = 8;
  const int64_t tiles = (P + kTile - 1) / kTile;
  pool_->parallel_for(tiles * kvh, 1, [&](size_t first, size_t last) {
    thread_local std::vector<float> scores;
    for (size_t job = first; job < last; ++job) {
      const int64_t t = (job / kvh) * kTile, kv_head = job % kvh;
      const KvSegment all{reinterpret_cast<const std::byte*>(s.k.data() + kv_head * hd),
                          reinterpret_cast<const std::byte*>(s.v.data() + kv_head * hd),
                          kvh * hd * int64_t(sizeof(float)), P, KvDtype::F32};
      const int64_t offset = (t * nH + kv_head * group) * hd;
      attend_queries(s.q.data() + offset, std::min(kTile, P - t), nH * hd, group, hd, std::span(&all, 1), bf16,
                     s.attn.data() + offset, nH * hd, scores);
    }
  });
  round(s.attn);
  linears({{&layer.o_proj, &s.a}}, s.attn, P, s.lora);
  norm(s.a, c.hidden_size, layer.post_attention_norm);
  for (size_t i = 0; i < s.h.size(); ++i) s.h[i] += s.a[i];
  round(s.h);
}

void Gemma4VisionTower::mlp(const Gemma4VisionLayer& layer, Scratch& s) const {
  const int64_t P = s.patches;
  s.x = s.h;
  norm(s.x, config_.hidden_size, layer.pre_feedforward_norm);
  linears({{&layer.gate_proj, &s.a}, {&layer.up_proj, &s.b}}, s.x, P, s.lora);
  gelu_tanh(s.a);
  round(s.a);
  for (size_t i = 0; i < s.a.size(); ++i) s.a[i] *= s.b[i];
  round(s.a);
  linears({{&layer.down_proj, &s.c}}, s.a, P, s.lora);
  norm(s.c, config_.hidden_size, layer.post_feedforward_norm);
  for (size_t i = 0; i < s.h.size(); ++i) s.h[i] += s.c[i];
  round(s.h);
}

// Gemma4VisionPooler: the mean of each k x k block of patches (in f32, then in the working dtype), in block order
// (row-major over the pooled grid), times sqrt(hidden) in f32; then the standardization, if any, in f32.
void Gemma4VisionTower::pool(Scratch& s, std::span<const int32_t> position_ids, std::vector<float>& out) const {
  const int64_t D = config_.hidden_size, k = config_.pooling_kernel_size;
  int64_t width = 1;  // max x + 1 over every position, padding counted as 0 (transformers clamps it)
  for (size_t i = 0; i < position_ids.size(); i += 2) width = std::max<int64_t>(width, position_ids[i] + 1);
  const int64_t columns = width / k;
  std::vector<int64_t> cell(s.patches);
  int64_t cells = 0;
  for (int64_t t = 0; t < s.patches; ++t)
    cells = std::max(cells, (cell[t] = s.px[t] / k + columns * (s.py[t] / k)) + 1);
  std::vector<float> sum(cells * D, 0.0f);
  std::vector<int64_t> members(cells, 0);
  const float weight = 1.0f / static_cast<float>(k * k);
  for (int64_t t = 0; t < s.patches; ++t) {
    ++members[cell[t]];
    for (int64_t i = 0; i < D; ++i) sum[cell[t] * D + i] += s.h[t * D + i] * weight;
  }
  out.clear();
  for (int64_t j = 0; j < cells; ++j)
    if (members[j]) out.insert(out.end(), sum.begin() + j * D, sum.begin() + (j + 1) * D);
  round(out);
  const float root_hidden = static_cast<float>(std::sqrt(static_cast<double>(D)));
  for (float& x : out) x *= root_hidden;
  if (config_.standardize)
    for (size_t r = 0; r < out.size() / D; ++r)
      for (int64_t i = 0; i < D; ++i) out[r * D + i] = (out[r * D + i] - std_bias_[i]) * std_scale_[i];
  round(out);
}

int64_t Gemma4VisionTower::soft_tokens(std::span<const int32_t> position_ids) const {
  int64_t real = 0;
  for (size_t i = 0; i + 1 < position_ids.size(); i += 2) real += !(position_ids[i] == -1 && position_ids[i + 1] == -1);
  return real / (config_.pooling_kernel_size * config_.pooling_kernel_size);
}

std::vector<float> Gemma4VisionTower::encode(const ImagePatches& image, const LoraAdapter* lora) const {
  const Gemma4VisionConfig& c = config_;
  const int64_t D = c.hidden_size, V = c.patch_values(), k2 = c.pooling_kernel_size * c.pooling_kernel_size;
  if (image.position_ids.size() % 2 != 0 || image.pixel_values.size() != image.position_ids.size() / 2 * V)
    throw Error(fmt::format("image: {} pixel values and {} position ids do not describe patches of {} values "
                            "(3 x patch_size {} squared) with an (x, y) each",
                            image.pixel_values.size(), image.position_ids.size(), V, c.patch_size));
  thread_local Scratch s;
  s.px.clear(), s.py.clear(), s.x.clear();
  s.lora = lora;
  // Gemma4VisionPatchEmbedder on the real patches: input_proj(2 (pixels - 0.5)) + table_x[x] + table_y[y].
  for (size_t p = 0; p < image.position_ids.size() / 2; ++p) {
    const int32_t x = image.position_ids[2 * p], y = image.position_ids[2 * p + 1];
    if (x == -1 && y == -1) continue;  // padding: masked out of attention and pooling alike
    if (x < 0 || y < 0 || x >= c.position_embedding_size || y >= c.position_embedding_size)
      throw Error(fmt::format("image: patch {} is at ({}, {}); positions must lie in 0..{} (position_embedding_size) "
                              "or be (-1, -1) for padding",
                              p, x, y, c.position_embedding_size - 1));
    s.px.push_back(x), s.py.push_back(y);
    for (int64_t i = 0; i < V; ++i) s.x.push_back(2 * (image.pixel_values[p * V + i] - 0.5f));
  }
  s.patches = static_cast<int64_t>(s.px.size());
  if (s.patches == 0 || s.patches % k2 != 0)
    throw Error(fmt::format("image: {} real patches; expected a positive multiple of pooling_kernel_size^2 = {}",
                            s.patches, k2));
  round(s.x);
  linears({{&input_proj_, &s.h}}, s.x, s.patches, s.lora);
  for (int64_t t = 0; t < s.patches; ++t)
    for (int64_t i = 0; i < D; ++i) {
      float position = position_embedding_table_[s.px[t] * D + i] +
                       position_embedding_table_[(c.position_embedding_size + s.py[t]) * D + i];
      if (precision_ != Precision::F32) position = round_to_bf16(position);
      s.h[t * D + i] += position;
    }
  round(s.h);
  for (const Gemma4VisionLayer& layer : layers_) {
    attention(layer, s);
    mlp(layer, s);
  }
  std::vector<float> pooled;
  pool(s, image.position_ids, pooled);
  return embed_vision_.embed(pooled, precision_, *pool_, lora ? lora->find_tower(embed_vision_.module) : nullptr);
}

}  // namespace qs
