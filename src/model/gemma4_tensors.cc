#include "model/gemma4_tensors.h"

#include <fmt/format.h>

namespace qs {

std::string expert_module(const std::string& layer_prefix, int64_t expert, const std::string& proj) {
  return fmt::format("{}experts.{}.{}", layer_prefix, expert, proj);
}

namespace {

class Inventory {
 public:
  explicit Inventory(std::vector<ArchTensor>& out) : out_(out) {}

  void linear(const std::string& module, int64_t out, int64_t in, int64_t layer, bool quantized,
              std::string fused = "") {
    out_.push_back({module + ".weight", module, {out, in}, TensorRole::Linear, layer, quantized, std::move(fused)});
  }
  void add(const std::string& name, std::vector<int64_t> shape, TensorRole role, int64_t layer = -1) {
    bool is_module_weight = name.size() > 7 && name.ends_with(".weight");
    std::string module = is_module_weight ? name.substr(0, name.size() - 7) : name;
    out_.push_back({name, module, std::move(shape), role, layer, false, ""});
  }

 private:
  std::vector<ArchTensor>& out_;
};

void add_attention(Inventory& inv, const Gemma4TextConfig& c, const std::string& p, int64_t l) {
  int64_t hd = c.layer_head_dim(l), kvh = c.layer_kv_heads(l), H = c.hidden_size;
  std::string qkv = p + "self_attn.qkv";
  inv.linear(p + "self_attn.q_proj", c.num_attention_heads * hd, H, l, true, qkv);
  if (!c.is_kv_shared(l)) {
    inv.linear(p + "self_attn.k_proj", kvh * hd, H, l, true, qkv);
    if (c.layer_has_v_proj(l)) inv.linear(p + "self_attn.v_proj", kvh * hd, H, l, true, qkv);
    inv.add(p + "self_attn.k_norm.weight", {hd}, TensorRole::Norm, l);
  }
  inv.add(p + "self_attn.q_norm.weight", {hd}, TensorRole::Norm, l);
  inv.linear(p + "self_attn.o_proj", H, c.num_attention_heads * hd, l, true);
}

void add_feed_forward(Inventory& inv, const Gemma4TextConfig& c, const std::string& p, int64_t l) {
  int64_t H = c.hidden_size, I = c.layer_intermediate(l);
  inv.linear(p + "mlp.gate_proj", I, H, l, true, p + "mlp.gate_up");
  inv.linear(p + "mlp.up_proj", I, H, l, true, p + "mlp.gate_up");
  inv.linear(p + "mlp.down_proj", H, I, l, true);
  for (const char* n : {"pre_feedforward_layernorm", "post_feedforward_layernorm"})
    inv.add(p + n + ".weight", {H}, TensorRole::Norm, l);
  if (!c.enable_moe_block) return;
  int64_t E = c.num_experts, Im = c.moe_intermediate_size;
  inv.add(p + "router.proj.weight", {E, H}, TensorRole::RouterLinear, l);
  inv.add(p + "router.scale", {H}, TensorRole::RouterVector, l);
  inv.add(p + "router.per_expert_scale", {E}, TensorRole::RouterVector, l);
  inv.add(p + "experts.gate_up_proj", {E, 2 * Im, H}, TensorRole::FusedExperts, l);
  inv.add(p + "experts.down_proj", {E, H, Im}, TensorRole::FusedExperts, l);
  for (const char* n : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"})
    inv.add(p + n + ".weight", {H}, TensorRole::Norm, l);
}

// An assistant drafter's own linears beside its decoder (transformers' Gemma4AssistantForCausalLM): a QAT-trained
// drafter has them on the grid like its decoder's, so repack packs them (one off the grid stays bf16, named).
void add_assistant_linears(Inventory& inv, const ModelConfig& config) {
  const int64_t H = config.text.hidden_size, Hb = config.assistant->backbone_hidden_size;
  inv.linear("pre_projection", H, 2 * Hb, -1, true);
  inv.linear("post_projection", Hb, H, -1, true);
  if (config.assistant->use_ordered_embeddings)
    inv.linear("masked_embedding.centroids", config.assistant->num_centroids, H, -1, true);
}

}  // namespace

std::vector<ArchTensor> gemma4_text_tensors(const ModelConfig& config) {
  const Gemma4TextConfig& c = config.text;
  const std::string m = config.text_prefix();
  const int64_t H = c.hidden_size, L = c.num_hidden_layers, Dp = c.hidden_size_per_layer_input;
  std::vector<ArchTensor> out;
  Inventory inv(out);
  inv.add(m + "embed_tokens.weight", {c.vocab_size, H}, TensorRole::Embedding);
  if (c.has_ple()) {
    inv.add(m + "embed_tokens_per_layer.weight", {c.vocab_size_per_layer_input, L * Dp}, TensorRole::PerLayerEmbedding);
    inv.linear(m + "per_layer_model_projection", L * Dp, H, -1, true);
    inv.add(m + "per_layer_projection_norm.weight", {Dp}, TensorRole::Norm);
  }
  for (int64_t l = 0; l < L; ++l) {
    std::string p = fmt::format("{}layers.{}.", m, l);
    for (const char* n : {"input_layernorm", "post_attention_layernorm"})
      inv.add(p + n + ".weight", {H}, TensorRole::Norm, l);
    add_attention(inv, c, p, l);
    add_feed_forward(inv, c, p, l);
    if (c.has_ple()) {
      inv.linear(p + "per_layer_input_gate", Dp, H, l, true);
      inv.linear(p + "per_layer_projection", H, Dp, l, true);
      inv.add(p + "post_per_layer_input_norm.weight", {H}, TensorRole::Norm, l);
    }
    inv.add(p + "layer_scalar", {1}, TensorRole::LayerScalar, l);
  }
  inv.add(m + "norm.weight", {H}, TensorRole::Norm);
  if (config.assistant) add_assistant_linears(inv, config);
  for (auto& t : out)
    if (t.role == TensorRole::FusedExperts) {
      t.quantized_in_w4a16 = true;
      t.fused_group = fmt::format("{}layers.{}.experts", m, t.layer);
    }
  return out;
}

std::vector<std::string> gemma4_tolerated_extras(const ModelConfig& config) {
  const Gemma4TextConfig& c = config.text;
  std::vector<std::string> out = {"lm_head.weight"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_kv_shared(l)) continue;
    std::string p = fmt::format("{}layers.{}.self_attn.", config.text_prefix(), l);
    for (const char* n : {"k_proj", "v_proj"})
      for (const char* s : {".weight", ".weight_packed", ".weight_scale", ".weight_shape"})
        out.push_back(p + n + s);
    out.push_back(p + "k_norm.weight");
  }
  return out;
}

ArchTensorIndex::ArchTensorIndex(const ModelConfig& config) : arch_(gemma4_text_tensors(config)) {
  for (const ArchTensor& a : arch_) {
    by_name_[a.name] = &a;
    if (a.role == TensorRole::Linear) by_module_[a.module] = &a;
    if (a.role == TensorRole::FusedExperts) by_experts_prefix_.emplace(a.fused_group + ".", &a);
  }
}

const ArchTensor* ArchTensorIndex::find(std::string_view n) const {
  if (auto it = by_name_.find(n); it != by_name_.end()) return it->second;
  if (size_t dot = n.rfind('.'); dot != std::string_view::npos) {
    const std::string_view suffix = n.substr(dot);
    if (suffix == ".weight_packed" || suffix == ".weight_scale" || suffix == ".weight_shape")
      if (auto it = by_module_.find(n.substr(0, dot)); it != by_module_.end()) return it->second;
  }
  if (size_t e = n.find("experts."); e != std::string_view::npos)
    if (auto it = by_experts_prefix_.find(n.substr(0, e + 8)); it != by_experts_prefix_.end()) return it->second;
  return nullptr;
}

}  // namespace qs
