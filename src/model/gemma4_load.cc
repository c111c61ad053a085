// Loading the Gemma 4 text decoder from a checkpoint directory in either QAT format (model/weight_reader.h);
// vision and audio towers are never read here.
#include <fmt/format.h>

#include <cmath>

#include "model/gemma4.h"
#include "model/gemma4_tensors.h"
#include "model/weight_reader.h"
#include "quant/qat_grid.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

// Fused experts [E, 2I, H] / [E, H, I] (bf16 export) or experts.{e}.{gate,up,down}_proj modules.
std::vector<ExpertWeights> read_experts(WeightReader& r, const std::string& p, int64_t E, int64_t I, int64_t H) {
  std::vector<ExpertWeights> out(E);
  if (r.tensor_present(p + "experts.gate_up_proj")) {
    LinearWeight gate_up = r.bf16_matrix(p + "experts.gate_up_proj", {E, 2 * I, H}, E * 2 * I);
    LinearWeight down = r.bf16_matrix(p + "experts.down_proj", {E, H, I}, E * H);
    for (int64_t e = 0; e < E; ++e)
      out[e] = {gate_up.rows(e * 2 * I, I), gate_up.rows(e * 2 * I + I, I), down.rows(e * H, H)};
    return out;
  }
  for (int64_t e = 0; e < E; ++e)
    out[e] = {r.linear(expert_module(p, e, "gate_proj"), I, H), r.linear(expert_module(p, e, "up_proj"), I, H),
              r.linear(expert_module(p, e, "down_proj"), H, I)};
  return out;
}

Gemma4Layer load_layer(WeightReader& r, const Gemma4TextConfig& c, const std::string& p, int64_t l) {
  Gemma4Layer L;
  const int64_t H = c.hidden_size, hd = c.layer_head_dim(l), kvh = c.layer_kv_heads(l), nH = c.num_attention_heads;
  L.full_attention = c.is_full(l);
  L.head_dim = hd;
  L.kv_heads = kvh;
  L.computes_kv = !c.is_kv_shared(l);
  L.kv_source = c.kv_source(l);
  L.input_norm = r.vector(p + "input_layernorm.weight", {H});
  L.post_attention_norm = r.vector(p + "post_attention_layernorm.weight", {H});
  L.pre_feedforward_norm = r.vector(p + "pre_feedforward_layernorm.weight", {H});
  L.post_feedforward_norm = r.vector(p + "post_feedforward_layernorm.weight", {H});
  L.q_proj = r.linear(p + "self_attn.q_proj", nH * hd, H);
  L.q_norm = r.vector(p + "self_attn.q_norm.weight", {hd});
  L.o_proj = r.linear(p + "self_attn.o_proj", H, nH * hd);
  if (L.computes_kv) {  // KV-shared layers' k/v/k_norm, present in some exports, are never read
    L.k_proj = r.linear(p + "self_attn.k_proj", kvh * hd, H);
    if (c.layer_has_v_proj(l)) L.v_proj = r.linear(p + "self_attn.v_proj", kvh * hd, H);
    L.k_norm = r.vector(p + "self_attn.k_norm.weight", {hd});
  }
  const int64_t I = c.layer_intermediate(l);
  L.gate_proj = r.linear(p + "mlp.gate_proj", I, H);
  L.up_proj = r.linear(p + "mlp.up_proj", I, H);
  L.down_proj = r.linear(p + "mlp.down_proj", H, I);
  if (c.enable_moe_block) {
    const int64_t E = c.num_experts;
    L.router_proj = r.linear(p + "router.proj", E, H);
    L.router_scale = r.vector(p + "router.scale", {H});
    L.per_expert_scale = r.vector(p + "router.per_expert_scale", {E});
    L.pre_feedforward_norm_2 = r.vector(p + "pre_feedforward_layernorm_2.weight", {H});
    L.post_feedforward_norm_1 = r.vector(p + "post_feedforward_layernorm_1.weight", {H});
    L.post_feedforward_norm_2 = r.vector(p + "post_feedforward_layernorm_2.weight", {H});
    L.experts = read_experts(r, p, E, c.moe_intermediate_size, H);
  }
  if (c.has_ple()) {
    const int64_t Dp = c.hidden_size_per_layer_input;
    L.per_layer_input_gate = r.linear(p + "per_layer_input_gate", Dp, H);
    L.per_layer_projection = r.linear(p + "per_layer_projection", H, Dp);
    L.post_per_layer_input_norm = r.vector(p + "post_per_layer_input_norm.weight", {H});
  }
  L.layer_scalar = r.vector(p + "layer_scalar", {1})[0];
  return L;
}

// inv_freq[i] = theta^(-2i / head_dim) for the rotated pairs; 0 (no rotation) for the rest (proportional RoPE
// rotates only partial_rotary_factor of the pairs but keeps the full head_dim as the exponent's denominator).
std::vector<float> rope_inv_freq(double theta, int64_t head_dim, double partial) {
  int64_t rotated = static_cast<int64_t>(partial * head_dim / 2);
  std::vector<float> f(head_dim / 2, 0.0f);
  for (int64_t i = 0; i < rotated; ++i)
    f[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return f;
}

}  // namespace

Precision parse_precision(const std::string& name) {
  if (name == "f32") return Precision::F32;
  if (name == "bf16") return Precision::BF16;
  if (name == "int8") return Precision::Int8;
  throw Error(fmt::format("precision '{}': expected f32, bf16 or int8", name));
}

std::string_view precision_name(Precision p) {
  return p == Precision::F32 ? "f32" : p == Precision::BF16 ? "bf16" : "int8";
}

// What loading copies or scans: every int4 tensor (copied into tiles) and the tied embedding (fitted to the grid).
uint64_t load_work_bytes(const Checkpoint& checkpoint, const TensorRef& embed) {
  uint64_t bytes = embed.nbytes();
  for (const TensorRef& t : checkpoint.tensors())
    if (t.name().ends_with(".weight_packed") || t.name().ends_with(".weight_scale")) bytes += t.nbytes();
  return bytes;
}

std::unique_ptr<Gemma4Model> Gemma4Model::load(const fs::path& dir, Precision precision, bool show_progress) {
  auto m = std::unique_ptr<Gemma4Model>(new Gemma4Model());
  m->checkpoint_ = Checkpoint::open(dir);
  auto cfg = m->checkpoint_.config_path();
  if (!cfg) throw Error(fmt::format("{}: no config.json", dir.string()));
  m->config_ = read_model_config(*cfg);
  m->precision_ = precision;
  m->kv_dtype_ = precision == Precision::F32 ? KvDtype::F32 : KvDtype::BF16;
  m->pool_ = &ThreadPool::shared();
  const Gemma4TextConfig& c = m->config_.text;
  const std::string prefix = m->config_.text_prefix();
  const TensorRef* embed_ref = m->checkpoint_.find(prefix + "embed_tokens.weight");
  Progress progress("load " + dir.filename().string(),
                    embed_ref ? load_work_bytes(m->checkpoint_, *embed_ref) : 0, show_progress);
  WeightReader r(m->checkpoint_, m->config_, m->int4_storage_, *m->pool_, progress, activations_of(precision));
  const TensorRef& embed = r.tensor(prefix + "embed_tokens.weight", {c.vocab_size, c.hidden_size});
  if (embed.dtype() != DType::BF16) throw Error(fmt::format("{}: embed_tokens must be BF16", dir.string()));
  m->embed_tokens_ = embed.bytes().data();
  m->lm_head_ = {c.vocab_size, c.hidden_size, WeightKind::BF16, m->embed_tokens_};  // tied
  if (auto packed = pack_int4_lossless(m->embed_tokens_, c.vocab_size, c.hidden_size, *m->pool_)) {
    LinearWeight head{c.vocab_size, c.hidden_size, WeightKind::Int4, reinterpret_cast<const std::byte*>(packed->words.data()),
                      reinterpret_cast<const std::byte*>(packed->scales.data()), kQatGroupSize};
    if (r.tile(head)) {  // a vocabulary of whole tiles (every real one): the head is the tiled copy
      m->lm_head_ = head;
      embed.release();  // from now on the table is only gathered a row per token
    }
  }
  progress.advance(embed.nbytes());
  if (c.has_ple()) {
    const int64_t Dp = c.hidden_size_per_layer_input, L = c.num_hidden_layers;
    const TensorRef& ple = r.tensor(prefix + "embed_tokens_per_layer.weight", {c.vocab_size_per_layer_input, L * Dp});
    if (ple.dtype() != DType::BF16) throw Error(fmt::format("{}: embed_tokens_per_layer must be BF16", dir.string()));
    m->embed_tokens_per_layer_ = ple.bytes().data();
    m->per_layer_model_projection_ = r.linear(prefix + "per_layer_model_projection", L * Dp, c.hidden_size);
    m->per_layer_projection_norm_ = r.vector(prefix + "per_layer_projection_norm.weight", {Dp});
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    m->layers_.push_back(load_layer(r, c, fmt::format("{}layers.{}.", prefix, l), l));
  m->final_norm_ = r.vector(prefix + "norm.weight", {c.hidden_size});
  progress.finish();
  m->int4_ = r.int4();
  m->weight_bytes_ = r.bytes() + embed.nbytes();
  m->inv_freq_sliding_ = rope_inv_freq(c.rope_theta_sliding, c.head_dim, 1.0);
  m->inv_freq_full_ = rope_inv_freq(c.rope_theta_full, c.global_head_dim,
                                    c.rope_type_full == "proportional" ? c.partial_rotary_factor_full : 1.0);
  return m;
}

void Gemma4Model::set_precision(Precision p) {
  if ((p == Precision::F32) != (precision_ == Precision::F32))
    throw Error(fmt::format("precision {} -> {}: the KV cache layout would change; load the model again",
                            precision_name(precision_), precision_name(p)));
  precision_ = p;
}

KvLayout Gemma4Model::kv_layout(int64_t block_size, int64_t sliding_kept) const {
  return kv_layout_for_config(config_.text, kv_dtype_, block_size, std::max(config_.text.sliding_window, sliding_kept));
}

KvCache Gemma4Model::new_cache(int64_t max_context, int64_t max_tentative, int64_t sliding_kept) const {
  KvLayout layout = kv_layout(16, sliding_kept);
  layout.max_tentative = max_tentative;
  const KvPoolSize size = kv_pool_for_sequences(layout, 1, max_context);
  return KvCache(std::make_shared<KvPool>(std::move(layout), size), max_context);
}

}  // namespace qs
