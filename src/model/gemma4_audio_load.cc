// Loading the Gemma 4 audio tower and embed_audio from a checkpoint in either QAT format (model/weight_reader.h):
// every Linear int4 or bf16 as the file holds it, convolution kernels bf16, norms and clip bounds as f32.
#include <fmt/format.h>

#include "model/gemma4_audio.h"
#include "model/weight_reader.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace {

const std::string kTower = "model.audio_tower.";

// A plain nn.Linear as a ClippableLinear without bounds, named as a LoRA adapter names it.
ClippableLinear plain(WeightReader& r, const std::string& module, int64_t out, int64_t in) {
  return {r.linear(module, out, in), module};
}

class AudioReader {
 public:
  AudioReader(WeightReader& r, const Gemma4AudioConfig& c) : r_(r), c_(c) {}

  ClippableLinear clippable(const std::string& module, int64_t out, int64_t in) {
    ClippableLinear l{r_.linear(module + ".linear", out, in), module + ".linear"};
    if (!c_.use_clipped_linears) return l;
    l.input_min = r_.vector(module + ".input_min", {})[0];
    l.input_max = r_.vector(module + ".input_max", {})[0];
    l.output_min = r_.vector(module + ".output_min", {})[0];
    l.output_max = r_.vector(module + ".output_max", {})[0];
    return l;
  }

  Gemma4AudioFeedForward feed_forward(const std::string& p) {
    const int64_t H = c_.hidden_size;
    return {r_.vector(p + "pre_layer_norm.weight", {H}), r_.vector(p + "post_layer_norm.weight", {H}),
            clippable(p + "ffw_layer_1", 4 * H, H), clippable(p + "ffw_layer_2", H, 4 * H)};
  }

  Gemma4AudioAttention attention(const std::string& p) {
    const int64_t H = c_.hidden_size;
    return {clippable(p + "q_proj", H, H), clippable(p + "k_proj", H, H), clippable(p + "v_proj", H, H),
            clippable(p + "post", H, H), plain(r_, p + "relative_k_proj", H, H),
            r_.vector(p + "per_dim_scale", {c_.head_dim()})};
  }

  Gemma4AudioLightConv1d light_conv(const std::string& p) {
    const int64_t H = c_.hidden_size;
    return {r_.vector(p + "pre_layer_norm.weight", {H}), r_.vector(p + "conv_norm.weight", {H}),
            clippable(p + "linear_start", 2 * H, H), clippable(p + "linear_end", H, H),
            r_.vector(p + "depthwise_conv1d.weight", {H, 1, c_.conv_kernel_size})};
  }

  Gemma4AudioLayer layer(int64_t l) {
    const std::string p = fmt::format("{}layers.{}.", kTower, l);
    const int64_t H = c_.hidden_size;
    Gemma4AudioLayer L;
    L.feed_forward1 = feed_forward(p + "feed_forward1.");
    L.feed_forward2 = feed_forward(p + "feed_forward2.");
    L.self_attn = attention(p + "self_attn.");
    L.lconv1d = light_conv(p + "lconv1d.");
    L.norm_pre_attn = r_.vector(p + "norm_pre_attn.weight", {H});
    L.norm_post_attn = r_.vector(p + "norm_post_attn.weight", {H});
    L.norm_out = r_.vector(p + "norm_out.weight", {H});
    return L;
  }

  Gemma4AudioSubsampleLayer subsample(int64_t i, int64_t in, int64_t out) {
    const std::string p = fmt::format("{}subsample_conv_projection.layer{}.", kTower, i);
    return {r_.bf16_matrix(p + "conv.weight", {out, in, 3, 3}, out), r_.vector(p + "norm.weight", {out})};
  }

 private:
  WeightReader& r_;
  const Gemma4AudioConfig& c_;
};

}  // namespace

std::unique_ptr<Gemma4AudioEncoder> Gemma4AudioEncoder::load(const Checkpoint& checkpoint, const ModelConfig& config,
                                                             Precision precision) {
  auto e = std::unique_ptr<Gemma4AudioEncoder>(new Gemma4AudioEncoder());
  e->audio_ = parse_audio_config(config, checkpoint.dir().string() + "/config.json");
  e->text_hidden_ = config.text.hidden_size;
  e->precision_ = precision;
  e->pool_ = &ThreadPool::shared();
  const Gemma4AudioConfig& c = e->audio_;
  Progress progress("load audio tower", 0, false);
  WeightReader r(checkpoint, config, e->int4_storage_, *e->pool_, progress, e->activations());
  AudioReader a(r, c);
  const int64_t C0 = c.subsampling_conv_channels[0], C1 = c.subsampling_conv_channels[1];
  e->subsample_[0] = a.subsample(0, 1, C0);
  e->subsample_[1] = a.subsample(1, C0, C1);
  e->input_proj_linear_ =
      plain(r, kTower + "subsample_conv_projection.input_proj_linear", c.hidden_size, c.projection_input());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) e->layers_.push_back(a.layer(l));
  e->output_proj_ = plain(r, kTower + "output_proj", c.output_proj_dims, c.hidden_size);
  e->output_proj_bias_ = r.vector(kTower + "output_proj.bias", {c.output_proj_dims});
  e->embedding_projection_ = plain(r, "model.embed_audio.embedding_projection", e->text_hidden_, c.output_proj_dims);
  e->weight_bytes_ = r.bytes();
  return e;
}

}  // namespace qs
