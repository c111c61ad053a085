// The Gemma 4 audio tower's forward pass. Names follow transformers' modeling_gemma4.py; in BF16 precision every
// activation is rounded where transformers' bf16 model rounds it (after each op; attention itself runs in f32
// there as here).
#include "model/gemma4_audio.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/ops.h"
#include "model/lora_adapter.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {

// The activations of one clip: rows are frames (subsampled as the tower goes), `frame_valid` says which are real.
struct Gemma4AudioEncoder::Clip {
  int64_t frames = 0, width = 0, channels = 0;  // the subsampling's [frames, width, channels] (channels last)
  std::vector<uint8_t> frame_valid;
  std::vector<float> x, y, z, cols, q, k, v, attn, residual, clamped[3];
  const LoraAdapter* lora = nullptr;  // the sequence's adapter, when it adapts the tower
};

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20
float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void clamp(std::span<float> x, float lo, float hi) {
  for (float& v : x) v = std::clamp(v, lo, hi);
}

// Rows of a 3x3, stride 2, padding 1 convolution's input patches, [C x 3 x 3] each in PyTorch's weight order, for
// output frames [t0, t1) of an input [T, F, C] (channels last); outside the input counts as 0.
void im2col_3x3_stride2(const float* x, int64_t T, int64_t F, int64_t C, int64_t t0, int64_t t1, int64_t F_out,
                        float* cols) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t f = 0; f < F_out; ++f) {
      float* row = cols + ((t - t0) * F_out + f) * C * 9;
      for (int64_t kt = 0; kt < 3; ++kt)
        for (int64_t kf = 0; kf < 3; ++kf) {
          const int64_t ti = 2 * t - 1 + kt, fi = 2 * f - 1 + kf;
          const bool inside = ti >= 0 && ti < T && fi >= 0 && fi < F;
          for (int64_t c = 0; c < C; ++c) row[c * 9 + kt * 3 + kf] = inside ? x[(ti * F + fi) * C + c] : 0.0f;
        }
    }
}

}  // namespace

void Gemma4AudioEncoder::round(std::span<float> x) const {
  if (precision_ != Precision::F32) round_to_bf16(x);
}

// An adapter's low-rank product joins a linear's output (bias included), before any output clamp: PEFT wraps the
// inner nn.Linear.
void Gemma4AudioEncoder::add_lora(const ClippableLinear& w, const float* x, int64_t rows, std::vector<float>& y,
                                  const Clip& a) const {
  if (const LoraWeights* lw = a.lora ? a.lora->find_tower(w.module) : nullptr)
    lw->add_to(x, all_rows(rows), y.data(), precision_ != Precision::F32, *pool_);
}

void Gemma4AudioEncoder::linear(const ClippableLinear& w, const float* x, int64_t rows, std::vector<float>& y,
                                const Clip& a, std::span<const float> bias) const {
  const int64_t out = w.linear.out;
  y.resize(rows * out);
  linear_forward(w.linear, x, rows, y.data(), *pool_, activations());
  if (!bias.empty())
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < out; ++i) y[t * out + i] += bias[i];
  round(y);
  add_lora(w, x, rows, y, a);
}

void Gemma4AudioEncoder::clipped(std::initializer_list<std::pair<const ClippableLinear*, std::vector<float>*>> wy,
                                 const std::vector<float>& x, int64_t rows, Clip& a) const {
  std::array<LinearJob, 3> jobs;
  if (wy.size() > jobs.size()) throw Error("clipped: more linears than one call takes");
  size_t n = 0;
  for (auto [l, y] : wy) {
    const float* in = x.data();
    if (std::isfinite(l->input_min) || std::isfinite(l->input_max)) {
      a.clamped[n] = x;
      clamp(a.clamped[n], l->input_min, l->input_max);
      in = a.clamped[n].data();
    }
    y->resize(rows * l->linear.out);
    jobs[n++] = {&l->linear, in, rows, y->data()};
  }
  linear_forward(std::span(jobs.data(), n), *pool_, activations());
  size_t j = 0;
  for (auto [l, y] : wy) {
    round(*y);
    add_lora(*l, jobs[j++].x, rows, *y, a);
    clamp(*y, l->output_min, l->output_max);
  }
}

Activations Gemma4AudioEncoder::activations() const {
  // Int8 activations are the text model's opt-in; the tower's linears keep bf16 ones.
  return precision_ == Precision::F32 ? Activations::F32 : Activations::BF16;
}

void Gemma4AudioEncoder::norm(std::vector<float>& x, const std::vector<float>& weight) const {
  const int64_t n = static_cast<int64_t>(weight.size());
  rms_norm(x.data(), static_cast<int64_t>(x.size()) / n, n, weight.data(), static_cast<float>(audio_.rms_norm_eps));
  round(x);
}

void Gemma4AudioEncoder::clamp_gradient(std::vector<float>& x) const {
  // transformers clips at min(gradient_clipping, the dtype's max): 1e10 either way.
  const float g = static_cast<float>(audio_.gradient_clipping);
  clamp(x, -g, g);
}

std::vector<uint8_t> Gemma4AudioEncoder::soft_token_mask(std::span<const uint8_t> frame_mask) {
  std::vector<uint8_t> out;
  for (size_t t = 0; t < frame_mask.size(); t += 4) out.push_back(frame_mask[t] ? 1 : 0);
  return out;
}

// Gemma4AudioSubSampleConvProjectionLayer: padding frames zeroed, the convolution as a linear over input patches
// (a block of output frames at a time, to bound the patch buffer), LayerNorm over channels, ReLU; every other
// frame's validity carries on.
void Gemma4AudioEncoder::subsample(const Gemma4AudioSubsampleLayer& layer, Clip& a) const {
  const int64_t T = a.frames, F = a.width, C = a.channels, C_out = layer.conv.out;
  const int64_t T_out = (T + 1) / 2, F_out = (F + 1) / 2;
  for (int64_t t = 0; t < T; ++t)
    if (!a.frame_valid[t]) std::fill_n(a.x.data() + t * F * C, F * C, 0.0f);
  round(a.x);  // the conv's input in the weights' dtype
  a.y.resize(T_out * F_out * C_out);
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 20) / (F_out * C * 9));  // ~4 MB of patches
  for (int64_t t0 = 0; t0 < T_out; t0 += block) {
    const int64_t t1 = std::min(T_out, t0 + block), rows = (t1 - t0) * F_out;
    a.cols.resize(rows * C * 9);
    im2col_3x3_stride2(a.x.data(), T, F, C, t0, t1, F_out, a.cols.data());
    linear_forward(layer.conv, a.cols.data(), rows, a.y.data() + t0 * F_out * C_out, *pool_, activations());
  }
  round(a.y);
  layer_norm(a.y.data(), T_out * F_out, C_out, layer.norm.data(), nullptr, static_cast<float>(audio_.rms_norm_eps));
  round(a.y);
  for (float& v : a.y) v = std::max(v, 0.0f);
  a.x.swap(a.y);
  a.frames = T_out, a.width = F_out, a.channels = C_out;
  std::vector<uint8_t> valid;
  for (int64_t t = 0; t < T; t += 2) valid.push_back(a.frame_valid[t]);
  a.frame_valid.swap(valid);
}

// Gemma4AudioFeedForward: h + residual_weight * post_norm(ffw_2(silu(ffw_1(pre_norm(h))))).
void Gemma4AudioEncoder::feed_forward(const Gemma4AudioFeedForward& f, std::vector<float>& h, Clip& a) const {
  const int64_t rows = a.frames;
  a.x = h;
  clamp_gradient(a.x);
  norm(a.x, f.pre_layer_norm);
  clipped({{&f.ffw_layer_1, &a.y}}, a.x, rows, a);
  for (float& v : a.y) v = silu(v);
  round(a.y);
  clipped({{&f.ffw_layer_2, &a.z}}, a.y, rows, a);
  clamp_gradient(a.z);
  norm(a.z, f.post_layer_norm);
  for (float& v : a.z) v *= static_cast<float>(audio_.residual_weight);
  round(a.z);
  for (size_t i = 0; i < h.size(); ++i) h[i] += a.z[i];
  round(h);
}

// Gemma4AudioRelPositionalEncoding through relative_k_proj: keys of the relative distances context/2 .. 0, one
// row each ([sin | cos] of distance x inv_timescale), [context/2 + 1, hidden] as f32.
void Gemma4AudioEncoder::relative_keys(const Gemma4AudioAttention& att, std::vector<float>& keys,
                                       const Clip& a) const {
  const int64_t H = audio_.hidden_size, half = H / 2, P = audio_.context_size() / 2 + 1;
  const float increment = static_cast<float>(std::log(10000.0) / std::max<int64_t>(half - 1, 1));
  std::vector<float> embeddings(P * H);
  for (int64_t p = 0; p < P; ++p) {
    const float distance = static_cast<float>(P - 1 - p);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = distance * std::exp(static_cast<float>(i) * -increment);
      embeddings[p * H + i] = std::sin(angle);
      embeddings[p * H + half + i] = std::cos(angle);
    }
  }
  round(embeddings);
  linear(att.relative_k_proj, embeddings.data(), P, keys, a);
}

// Gemma4AudioAttention: chunked local attention. Queries go in blocks of chunk_size; block b sees the keys of
// positions b*chunk - (context_left - 1) .. (b+1)*chunk - 1 + context_right (its context, outside the clip: zero
// keys). The logit of query j and context slot c is q.k plus a relative-position term taken, as transformers'
// _rel_shift does, from the block's [query, distance] products at the shifted flat index; soft-capped; then any
// key that is padding or outside the window (0 <= q - k < context_left - 1, or k - q < context_right) gets
// attention_invalid_logits_value; softmax over the context.
void Gemma4AudioEncoder::attention(const Gemma4AudioAttention& att, const std::vector<float>& x,
                                   std::vector<float>& out, Clip& a) const {
  const int64_t T = a.frames, H = audio_.hidden_size, heads = audio_.num_attention_heads, hd = audio_.head_dim();
  const int64_t chunk = audio_.attention_chunk_size, past = audio_.attention_context_left - 1;
  const int64_t right = audio_.attention_context_right, context = audio_.context_size(), P = context / 2 + 1;
  const int64_t blocks = (T + chunk - 1) / chunk;
  clipped({{&att.q_proj, &a.q}, {&att.k_proj, &a.k}, {&att.v_proj, &a.v}}, x, T, a);
  std::vector<float> query_scale(hd), rel_keys;
  const float q_scale = static_cast<float>(std::pow(hd, -0.5) / std::log(2.0));
  const float k_scale = static_cast<float>(std::log(1 + std::exp(1.0)) / std::log(2.0));
  for (int64_t d = 0; d < hd; ++d) {
    float s = softplus(att.per_dim_scale[d]);
    query_scale[d] = precision_ == Precision::F32 ? s : round_to_bf16(s);  // softplus of the bf16 parameter
  }
  for (int64_t i = 0; i < T * H; ++i) a.q[i] = a.q[i] * q_scale * query_scale[i % hd];
  for (float& v : a.k) v *= k_scale;
  relative_keys(att, rel_keys, a);

  const float cap = static_cast<float>(audio_.attention_logit_cap);
  const float invalid = static_cast<float>(audio_.attention_invalid_logits_value);
  a.attn.assign(T * H, 0.0f);
  pool_->parallel_for(blocks * heads, 1, [&](size_t begin, size_t end) {
    std::vector<float> by_distance(chunk * P), logits(context);
    for (size_t job = begin; job < end; ++job) {
      const int64_t b = job / heads, h = job % heads, first = b * chunk;
      // [query row, relative-position column]: rows past the clip are zero queries.
      for (int64_t r = 0; r < chunk; ++r)
        for (int64_t p = 0; p < P; ++p)
          by_distance[r * P + p] =
              first + r < T ? dot(a.q.data() + (first + r) * H + h * hd, rel_keys.data() + p * H + h * hd, hd) : 0;
      for (int64_t j = 0; j < chunk && first + j < T; ++j) {
        const int64_t qpos = first + j;
        const float* q = a.q.data() + qpos * H + h * hd;
        float peak = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < context; ++c) {
          const int64_t kpos = first + c - past;
          const bool in_clip = kpos >= 0 && kpos < T;
          const float content = in_clip ? dot(q, a.k.data() + kpos * H + h * hd, hd) : 0.0f;
          const int64_t flat = j * context + c, row = flat / (context + 1), col = flat % (context + 1);
          const float position = col < P ? by_distance[row * P + col] : 0.0f;
          float logit = std::tanh((content + position) / cap) * cap;
          const int64_t distance = qpos - kpos;
          const bool in_window = (distance >= 0 && distance < past) || (distance < 0 && -distance < right);
          if (!(in_clip && a.frame_valid[kpos] && in_window)) logit = invalid;
          logits[c] = logit;
          peak = std::max(peak, logit);
        }
        float sum = 0;
        for (float& l : logits) sum += (l = std::exp(l - peak));
        float* o = a.attn.data() + qpos * H + h * hd;
        for (int64_t c = 0; c < context; ++c) {
          const int64_t kpos = first + c - past;
          if (kpos >= 0 && kpos < T) add_scaled(logits[c] / sum, a.v.data() + kpos * H + h * hd, o, hd);
        }
      }
    }
  });
  round(a.attn);
  clipped({{&att.post, &out}}, a.attn, T, a);
}

// Gemma4AudioLightConv1d: h + linear_end(silu(conv_norm(depthwise_causal_conv(glu(linear_start(pre_norm(h))))))).
void Gemma4AudioEncoder::light_conv(const Gemma4AudioLightConv1d& c, std::vector<float>& h, Clip& a) const {
  const int64_t T = a.frames, H = audio_.hidden_size, K = audio_.conv_kernel_size;
  a.x = h;
  norm(a.x, c.pre_layer_norm);
  clipped({{&c.linear_start, &a.y}}, a.x, T, a);
  a.x.resize(T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) a.x[t * H + i] = a.y[t * 2 * H + i] * sigmoid(a.y[t * 2 * H + H + i]);
  round(a.x);
  // Depthwise over time, causal: frame t sees frames t - K + 1 .. t (zeros before the clip).
  a.z.assign(T * H, 0.0f);
  pool_->parallel_for(T, 16, [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t src = static_cast<int64_t>(t) - (K - 1) + k;
        if (src < 0) continue;
        for (int64_t i = 0; i < H; ++i) a.z[t * H + i] += c.depthwise_conv1d[i * K + k] * a.x[src * H + i];
      }
  });
  round(a.z);
  clamp_gradient(a.z);
  norm(a.z, c.conv_norm);
  for (float& v : a.z) v = silu(v);
  round(a.z);
  clipped({{&c.linear_end, &a.y}}, a.z, T, a);
  for (size_t i = 0; i < h.size(); ++i) h[i] += a.y[i];
  round(h);
}

std::vector<float> Gemma4AudioEncoder::encode(std::span<const float> features, std::span<const uint8_t> frame_mask,
                                              const LoraAdapter* lora) const {
  const int64_t frames = static_cast<int64_t>(frame_mask.size()), mel = mel_bins();
  if (frames == 0) throw Error("audio features: a clip of no frames");
  if (static_cast<int64_t>(features.size()) != frames * mel)
    throw Error(fmt::format("audio features: {} values for {} frames; the audio tower expects {} mel bins a frame",
                            features.size(), frames, mel));
  Clip a;
  a.lora = lora;
  a.frames = frames, a.width = mel, a.channels = 1;
  a.frame_valid.assign(frame_mask.begin(), frame_mask.end());
  a.x.assign(features.begin(), features.end());
  for (const Gemma4AudioSubsampleLayer& layer : subsample_) subsample(layer, a);
  a.y = {}, a.cols = {};  // the clip's largest buffers, done with
  const int64_t T = a.frames;
  std::vector<float> h;
  linear(input_proj_linear_, a.x.data(), T, h, a);  // [T, width x channels], as transformers flattens it

  std::vector<float> attended;
  for (const Gemma4AudioLayer& layer : layers_) {
    feed_forward(layer.feed_forward1, h, a);
    a.residual = h;
    clamp_gradient(h);
    norm(h, layer.norm_pre_attn);
    attention(layer.self_attn, h, attended, a);
    clamp_gradient(attended);
    norm(attended, layer.norm_post_attn);
    for (size_t i = 0; i < h.size(); ++i) h[i] = attended[i] + a.residual[i];
    round(h);
    light_conv(layer.lconv1d, h, a);
    feed_forward(layer.feed_forward2, h, a);
    clamp_gradient(h);
    norm(h, layer.norm_out);
  }

  // Only the valid soft tokens go on (every op from here is per row): output_proj, then embed_audio.
  const int64_t H = audio_.hidden_size;
  std::vector<float> valid;
  for (int64_t t = 0; t < T; ++t)
    if (a.frame_valid[t]) valid.insert(valid.end(), h.begin() + t * H, h.begin() + (t + 1) * H);
  const int64_t n = static_cast<int64_t>(valid.size()) / H, D = output_proj_.linear.out;
  std::vector<float> projected, soft_tokens;
  linear(output_proj_, valid.data(), n, projected, a, output_proj_bias_);
  rms_norm(projected.data(), n, D, nullptr, static_cast<float>(audio_.rms_norm_eps));  // no scale
  round(projected);
  linear(embedding_projection_, projected.data(), n, soft_tokens, a);
  return soft_tokens;
}

}  // namespace qs
