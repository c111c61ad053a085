#include "engine/media_prompt.h"

#include <fmt/format.h>

#include <functional>

#include "media/audio_decode.h"
#include "media/image_decode.h"
#include "model/gemma4_audio.h"
#include "model/gemma4_unified_embedders.h"
#include "model/gemma4_vision.h"
#include "model/lora_adapter.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {

namespace {

// Encoded bytes accepted per item (the protocol parser's own limit is lower) and the audio decoded per clip: the
// feature extractor keeps the first 30 s, so a longer clip is decoded only up to a bound, then cut.
constexpr int64_t kMaxMediaBytes = 32ll << 20;
constexpr double kMaxAudioSeconds = 600.0;

std::span<const uint8_t> bytes_of(const media::MediaInput& input) {
  return {reinterpret_cast<const uint8_t*>(input.bytes.data()), input.bytes.size()};
}

int32_t marker_id(const Tokenizer& tokenizer, std::string_view token) {
  std::optional<int32_t> id = tokenizer.token_id(token);
  if (!id) throw Error(fmt::format("the tokenizer has no {} token, which media prompts need", token));
  return *id;
}

// The marker ids of one kind: the template's placeholder, and the processor's begin and end markers around the run.
struct Markers {
  int32_t placeholder, begin, end;
};

Markers markers_of(media::MediaKind kind, const Tokenizer& tokenizer) {
  if (kind == media::MediaKind::Image)
    return {marker_id(tokenizer, media::kImageToken), marker_id(tokenizer, media::kBeginOfImage),
            marker_id(tokenizer, media::kEndOfImage)};
  return {marker_id(tokenizer, media::kAudioSoftToken), marker_id(tokenizer, media::kBeginAudio),
          marker_id(tokenizer, media::kEndAudio)};
}

// The items of one kind, in request order.
std::vector<const media::MediaInput*> items_of(std::span<const media::MediaInput> inputs, media::MediaKind kind) {
  std::vector<const media::MediaInput*> items;
  for (const auto& input : inputs)
    if (input.kind == kind) items.push_back(&input);
  return items;
}

}  // namespace

MediaTowers::MediaTowers(MediaTowers&&) noexcept = default;
MediaTowers& MediaTowers::operator=(MediaTowers&&) noexcept = default;
MediaTowers::~MediaTowers() = default;

MediaTowers MediaTowers::load(const Gemma4Model& model, const std::filesystem::path& dir) {
  MediaTowers t;
  const ModelConfig& config = model.config();
  t.text_hidden_ = config.text.hidden_size;
  if (config.is_unified()) {
    if (config.unified_vision) {
      t.unified_vision_ = Gemma4UnifiedVisionEmbedder::load(model.checkpoint(), config, model.precision());
      t.image_options_ = media::read_image_processor_options(dir);
      t.image_options_.unified = true;
    }
    if (config.unified_audio)
      t.unified_audio_ = Gemma4UnifiedAudioEmbedder::load(model.checkpoint(), config, model.precision());
    return t;
  }
  if (config.has_vision) {
    t.vision_ = Gemma4VisionTower::load(model);
    t.image_options_ = media::read_image_processor_options(dir);
  }
  if (config.has_audio) {
    t.audio_ = Gemma4AudioEncoder::load(model.checkpoint(), config, model.precision());
    t.audio_options_ = media::read_audio_feature_options(dir);
  }
  return t;
}

std::shared_ptr<const PreparedMedia> MediaTowers::prepare(const media::MediaInput& input) const {
  auto out = std::make_shared<PreparedMedia>();
  out->kind = input.kind;
  out->where = input.where;
  if (input.kind == media::MediaKind::Image) {
    if (!images()) throw Error(fmt::format("{}: an image, but the model has no vision tower", input.where));
    media::ImageLimits limits;
    limits.max_bytes = kMaxMediaBytes;
    const std::string mime = input.declared_format.empty() ? "" : "image/" + input.declared_format;
    media::ImageProcessorOptions options = image_options_;
    if (input.image_soft_tokens > 0) options.max_soft_tokens = input.image_soft_tokens;
    out->image = media::preprocess_image(media::decode_image(bytes_of(input), limits, input.where, mime), options);
    return out;
  }
  if (!audio()) throw Error(fmt::format("{}: audio, but the model has no audio tower", input.where));
  const media::AudioLimits limits{kMaxMediaBytes, kMaxAudioSeconds};
  std::vector<float> wave = media::decode_audio(bytes_of(input), input.declared_format, limits, input.where);
  out->audio = unified_audio_ ? media::waveform_frames(wave, static_cast<int>(unified_audio_->samples_per_token()))
                              : media::extract_audio_features(wave, audio_options_);
  if (out->audio.num_soft_tokens == 0)
    throw Error(fmt::format("{}: the clip is too short for one audio token", input.where));
  return out;
}

std::vector<float> MediaTowers::encode(const PreparedMedia& p, const LoraAdapter* lora) const {
  const bool image = p.kind == media::MediaKind::Image;
  if (image ? !images() : !audio())
    throw Error(fmt::format("{}: the model has no {} tower", p.where, image ? "vision" : "audio"));
  std::vector<float> soft = image && unified_vision_ ? unified_vision_->encode(p.image.pixel_values, p.image.position_ids, lora)
                            : image                  ? vision_->encode({p.image.pixel_values, p.image.position_ids}, lora)
                            : unified_audio_         ? unified_audio_->encode(p.audio.features, lora)
                                                     : audio_->encode(p.audio.features, p.audio.mask, lora);
  if (static_cast<int64_t>(soft.size()) != p.soft_tokens() * text_hidden_)
    throw Error(fmt::format("{}: the {} tower gave {} values for {} soft tokens of {}", p.where,
                            image ? "vision" : "audio", soft.size(), p.soft_tokens(), text_hidden_));
  return soft;
}

int64_t PreparedMedia::soft_tokens() const {
  return kind == media::MediaKind::Image ? image.num_soft_tokens : audio.num_soft_tokens;
}

// Two independent 64-bit hashes (libstdc++'s murmur-based std::hash and FNV-1a) of the kind, the image budget (the
// same picture at another budget is other soft tokens) and the bytes: two different items share a key with odds of
// about 2^-128.
MediaKey media_key(const media::MediaInput& input) {
  const std::string_view bytes = input.bytes;
  const uint64_t budget = static_cast<uint64_t>(input.image_soft_tokens);
  uint64_t fnv = (0xcbf29ce484222325ull ^ static_cast<uint64_t>(input.kind)) * 0x100000001b3ull ^ budget;
  for (unsigned char c : bytes) fnv = (fnv ^ c) * 0x100000001b3ull;
  return {std::hash<std::string_view>{}(bytes) ^ (static_cast<uint64_t>(input.kind) << 63) ^ (budget << 40), fnv};
}

MediaKey media_key_under(const MediaKey& key, const LoraAdapter* lora) {
  if (!lora || !lora->adapts_towers()) return key;
  return {key.hi ^ lora->id(), key.lo ^ (lora->id() * 0x9e3779b97f4a7c15ull)};
}

void encode_media_span(MediaSpan& span, const MediaTowers& towers, const LoraAdapter* lora) {
  span.embeddings = towers.encode(*span.prepared, lora);
  span.prepared.reset();
}

std::vector<SoftTokens> MediaPrompt::soft_tokens() const {
  std::vector<SoftTokens> out;
  for (const MediaSpan& s : spans) out.push_back({s.first, s.embeddings, s.vision});
  return out;
}

MediaPrompt prepare_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
                                 const MediaTowers& towers, const Tokenizer& tokenizer) {
  MediaPrompt out;
  if (inputs.empty()) {
    out.tokens.assign(tokens.begin(), tokens.end());
    return out;
  }
  const media::MediaKind kinds[] = {media::MediaKind::Image, media::MediaKind::Audio};
  Markers markers[2];
  std::vector<const media::MediaInput*> items[2];
  size_t next[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    items[k] = items_of(inputs, kinds[k]);
    if (!items[k].empty()) markers[k] = markers_of(kinds[k], tokenizer);
  }
  for (int32_t id : tokens) {
    int k = 0;
    while (k < 2 && (items[k].empty() || id != markers[k].placeholder)) ++k;
    if (k == 2) {
      out.tokens.push_back(id);
      continue;
    }
    if (next[k] == items[k].size())
      throw Error(fmt::format("the prompt has more {} markers than the {} {} part(s) given",
                              media::media_kind_name(kinds[k]), items[k].size(), media::media_kind_name(kinds[k])));
    const media::MediaInput& input = *items[k][next[k]++];
    MediaSpan span;
    span.vision = kinds[k] == media::MediaKind::Image;
    span.prepared = towers.prepare(input);
    span.count = span.prepared->soft_tokens();
    span.key = media_key(input);
    out.tokens.push_back(markers[k].begin);
    span.first = static_cast<int64_t>(out.tokens.size());
    out.tokens.insert(out.tokens.end(), span.count, markers[k].placeholder);
    out.tokens.push_back(markers[k].end);
    out.spans.push_back(std::move(span));
  }
  for (int k = 0; k < 2; ++k)
    if (next[k] != items[k].size())
      throw Error(fmt::format("{}: the chat template wrote no {} marker for this part", items[k][next[k]]->where,
                              media::media_kind_name(kinds[k])));
  return out;
}

MediaPrompt expand_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
                                const MediaTowers& towers, const Tokenizer& tokenizer, const LoraAdapter* lora) {
  MediaPrompt out = prepare_media_prompt(tokens, inputs, towers, tokenizer);
  for (MediaSpan& span : out.spans) encode_media_span(span, towers, lora);
  return out;
}

}  // namespace qs
