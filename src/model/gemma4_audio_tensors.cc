#include "model/gemma4_audio_tensors.h"

#include <fmt/format.h>

namespace qs {
namespace {

class Inventory {
 public:
  Inventory(std::vector<AudioTensor>& out, const Gemma4AudioConfig& c) : out_(out), c_(c) {}

  void add(const std::string& name, std::vector<int64_t> shape) { out_.push_back({name, std::move(shape)}); }
  void linear(const std::string& module, int64_t out, int64_t in, bool packed = true) {
    out_.push_back({module + ".weight", {out, in}, packed});
  }
  void clippable(const std::string& module, int64_t out, int64_t in) {
    linear(module + ".linear", out, in);
    if (c_.use_clipped_linears)
      for (const char* bound : {"input_min", "input_max", "output_min", "output_max"}) add(module + "." + bound, {});
  }

 private:
  std::vector<AudioTensor>& out_;
  const Gemma4AudioConfig& c_;
};

}  // namespace

std::vector<AudioTensor> gemma4_audio_tensors(const Gemma4AudioConfig& c, int64_t text_hidden) {
  const std::string tower = "model.audio_tower.";
  const int64_t H = c.hidden_size, C0 = c.subsampling_conv_channels[0], C1 = c.subsampling_conv_channels[1];
  std::vector<AudioTensor> out;
  Inventory inv(out, c);
  const std::string sub = tower + "subsample_conv_projection.";
  inv.add(sub + "layer0.conv.weight", {C0, 1, 3, 3});
  inv.add(sub + "layer0.norm.weight", {C0});
  inv.add(sub + "layer1.conv.weight", {C1, C0, 3, 3});
  inv.add(sub + "layer1.norm.weight", {C1});
  inv.linear(sub + "input_proj_linear", H, c.projection_input());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", tower, l);
    for (const char* ff : {"feed_forward1.", "feed_forward2."}) {
      inv.clippable(p + ff + "ffw_layer_1", 4 * H, H);
      inv.clippable(p + ff + "ffw_layer_2", H, 4 * H);
      inv.add(p + ff + "pre_layer_norm.weight", {H});
      inv.add(p + ff + "post_layer_norm.weight", {H});
    }
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "post"}) inv.clippable(p + "self_attn." + proj, H, H);
    inv.linear(p + "self_attn.relative_k_proj", H, H);
    inv.add(p + "self_attn.per_dim_scale", {c.head_dim()});
    inv.clippable(p + "lconv1d.linear_start", 2 * H, H);
    inv.clippable(p + "lconv1d.linear_end", H, H);
    inv.add(p + "lconv1d.depthwise_conv1d.weight", {H, 1, c.conv_kernel_size});
    inv.add(p + "lconv1d.pre_layer_norm.weight", {H});
    inv.add(p + "lconv1d.conv_norm.weight", {H});
    for (const char* norm : {"norm_pre_attn", "norm_post_attn", "norm_out"}) inv.add(p + norm + ".weight", {H});
  }
  inv.linear(tower + "output_proj", c.output_proj_dims, H);
  inv.add(tower + "output_proj.bias", {c.output_proj_dims});
  inv.linear("model.embed_audio.embedding_projection", text_hidden, c.output_proj_dims, false);
  return out;
}

}  // namespace qs
