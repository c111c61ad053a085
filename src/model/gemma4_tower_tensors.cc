#include "model/gemma4_tower_tensors.h"

#include <span>

#include <fmt/format.h>

namespace qs {
namespace {

class Inventory {
 public:
  Inventory(std::vector<ArchTensor>& out, bool clipped) : out_(out), clipped_(clipped) {}

  void add(const std::string& name, std::vector<int64_t> shape, TensorRole role) {
    out_.push_back({name, name, std::move(shape), role, -1, false, ""});
  }
  void norm(const std::string& name, int64_t n) { add(name, {n}, TensorRole::Norm); }
  void linear(const std::string& module, int64_t out, int64_t in, bool packed = true, std::string fused = "") {
    out_.push_back({module + ".weight", module, {out, in}, TensorRole::Linear, -1, packed, std::move(fused)});
  }
  // Gemma4ClippableLinear: the Linear is `<module>.linear`; with clipping, four scalar bounds beside it.
  void clippable(const std::string& module, int64_t out, int64_t in, std::string fused = "") {
    linear(module + ".linear", out, in, true, std::move(fused));
    if (clipped_)
      for (const char* bound : {"input_min", "input_max", "output_min", "output_max"})
        add(module + "." + bound, {}, TensorRole::ClipBound);
  }

 private:
  std::vector<ArchTensor>& out_;
  bool clipped_;
};

}  // namespace

std::vector<ArchTensor> gemma4_vision_tensors(const Gemma4VisionConfig& v, int64_t text_hidden) {
  const std::string tower = "model.vision_tower.";
  const int64_t D = v.hidden_size, I = v.intermediate_size, hd = v.head_dim;
  const int64_t q = v.num_attention_heads * hd, kv = v.num_key_value_heads * hd;
  std::vector<ArchTensor> out;
  Inventory inv(out, v.use_clipped_linears);
  inv.linear(tower + "patch_embedder.input_proj", D, v.patch_values());
  inv.add(tower + "patch_embedder.position_embedding_table", {2, v.position_embedding_size, D},
          TensorRole::TowerParameter);
  for (int64_t l = 0; l < v.num_hidden_layers; ++l) {
    const std::string p = fmt::format("{}encoder.layers.{}.", tower, l);
    for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm"})
      inv.norm(p + norm + ".weight", D);
    // vLLM loads q/k/v and gate/up fused: each group keeps one scheme (repack keeps partners together).
    inv.clippable(p + "self_attn.q_proj", q, D, p + "self_attn.qkv");
    inv.clippable(p + "self_attn.k_proj", kv, D, p + "self_attn.qkv");
    inv.clippable(p + "self_attn.v_proj", kv, D, p + "self_attn.qkv");
    inv.clippable(p + "self_attn.o_proj", D, q);
    inv.norm(p + "self_attn.q_norm.weight", hd);
    inv.norm(p + "self_attn.k_norm.weight", hd);
    inv.clippable(p + "mlp.gate_proj", I, D, p + "mlp.gate_up");
    inv.clippable(p + "mlp.up_proj", I, D, p + "mlp.gate_up");
    inv.clippable(p + "mlp.down_proj", D, I);
  }
  if (v.standardize) {
    inv.add(tower + "std_bias", {D}, TensorRole::TowerParameter);
    inv.add(tower + "std_scale", {D}, TensorRole::TowerParameter);
  }
  inv.linear("model.embed_vision.embedding_projection", text_hidden, D, false);
  return out;
}

std::vector<ArchTensor> gemma4_audio_tensors(const Gemma4AudioConfig& c, int64_t text_hidden) {
  const std::string tower = "model.audio_tower.";
  const int64_t H = c.hidden_size, C0 = c.subsampling_conv_channels[0], C1 = c.subsampling_conv_channels[1];
  std::vector<ArchTensor> out;
  Inventory inv(out, c.use_clipped_linears);
  const std::string sub = tower + "subsample_conv_projection.";
  inv.add(sub + "layer0.conv.weight", {C0, 1, 3, 3}, TensorRole::TowerParameter);
  inv.norm(sub + "layer0.norm.weight", C0);
  inv.add(sub + "layer1.conv.weight", {C1, C0, 3, 3}, TensorRole::TowerParameter);
  inv.norm(sub + "layer1.norm.weight", C1);
  inv.linear(sub + "input_proj_linear", H, c.projection_input());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", tower, l);
    for (const char* ff : {"feed_forward1.", "feed_forward2."}) {
      inv.clippable(p + ff + "ffw_layer_1", 4 * H, H);
      inv.clippable(p + ff + "ffw_layer_2", H, 4 * H);
      inv.norm(p + ff + "pre_layer_norm.weight", H);
      inv.norm(p + ff + "post_layer_norm.weight", H);
    }
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "post"}) inv.clippable(p + "self_attn." + proj, H, H);
    inv.linear(p + "self_attn.relative_k_proj", H, H);
    inv.add(p + "self_attn.per_dim_scale", {c.head_dim()}, TensorRole::TowerParameter);
    inv.clippable(p + "lconv1d.linear_start", 2 * H, H);
    inv.clippable(p + "lconv1d.linear_end", H, H);
    inv.add(p + "lconv1d.depthwise_conv1d.weight", {H, 1, c.conv_kernel_size}, TensorRole::TowerParameter);
    inv.norm(p + "lconv1d.pre_layer_norm.weight", H);
    inv.norm(p + "lconv1d.conv_norm.weight", H);
    for (const char* norm : {"norm_pre_attn", "norm_post_attn", "norm_out"}) inv.norm(p + norm + ".weight", H);
  }
  inv.linear(tower + "output_proj", c.output_proj_dims, H);
  inv.add(tower + "output_proj.bias", {c.output_proj_dims}, TensorRole::TowerParameter);
  inv.linear("model.embed_audio.embedding_projection", text_hidden, c.output_proj_dims, false);
  return out;
}

bool is_tower_tensor(const std::string& name, Tower tower) {
  const std::span<const char* const> prefixes =
      tower == Tower::Vision ? std::span<const char* const>(kVisionTensorPrefixes) : kAudioTensorPrefixes;
  for (const char* prefix : prefixes)
    if (name.starts_with(prefix)) return true;
  return false;
}

bool is_tower_tensor(const std::string& name) {
  return is_tower_tensor(name, Tower::Vision) || is_tower_tensor(name, Tower::Audio);
}

std::vector<ArchTensor> gemma4_tower_tensors(const ModelConfig& config, Tower tower) {
  if (config.is_unified()) return {};  // the 12B has encoder-free embedders, no towers
  if (tower == Tower::Vision)
    return config.vision ? gemma4_vision_tensors(*config.vision, config.text.hidden_size) : std::vector<ArchTensor>{};
  return config.has_audio ? gemma4_audio_tensors(parse_audio_config(config, "config.json"), config.text.hidden_size)
                          : std::vector<ArchTensor>{};
}

std::vector<ArchTensor> gemma4_tower_tensors(const ModelConfig& config) {
  std::vector<ArchTensor> out = gemma4_tower_tensors(config, Tower::Vision);
  for (ArchTensor& a : gemma4_tower_tensors(config, Tower::Audio)) out.push_back(std::move(a));
  return out;
}

}  // namespace qs
