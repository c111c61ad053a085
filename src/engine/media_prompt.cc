#include "engine/media_prompt.h"

#include <fmt/format.h>

#include "media/audio_decode.h"
#include "media/image_decode.h"
#include "model/gemma4_audio.h"
#include "model/gemma4_vision.h"
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
  if (config.is_unified())
    throw Error(fmt::format("{}: {} reads images and audio through encoder-free embedders, which qatserve does not "
                            "implement yet: only text parts are accepted",
                            dir.string(), config.model_type));
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

std::vector<float> MediaTowers::encode_image(const media::MediaInput& input) const {
  if (!vision_) throw Error(fmt::format("{}: an image, but the model has no vision tower", input.where));
  media::ImageLimits limits;
  limits.max_bytes = kMaxMediaBytes;
  const std::string mime = input.declared_format.empty() ? "" : "image/" + input.declared_format;
  media::RgbImage image = media::decode_image(bytes_of(input), limits, input.where, mime);
  media::PreprocessedImage pre = media::preprocess_image(image, image_options_);
  std::vector<float> soft = vision_->encode({pre.pixel_values, pre.position_ids});
  if (static_cast<int64_t>(soft.size()) != int64_t{pre.num_soft_tokens} * text_hidden_)
    throw Error(fmt::format("{}: the vision tower gave {} values for {} soft tokens of {}", input.where, soft.size(),
                            pre.num_soft_tokens, text_hidden_));
  return soft;
}

std::vector<float> MediaTowers::encode_audio(const media::MediaInput& input) const {
  if (!audio_) throw Error(fmt::format("{}: audio, but the model has no audio tower", input.where));
  const media::AudioLimits limits{kMaxMediaBytes, kMaxAudioSeconds};
  std::vector<float> wave = media::decode_audio(bytes_of(input), input.declared_format, limits, input.where);
  media::AudioFeatures f = media::extract_audio_features(wave, audio_options_);
  if (f.num_soft_tokens == 0) throw Error(fmt::format("{}: the clip is too short for one audio token", input.where));
  std::vector<float> soft = audio_->encode(f.features, f.mask);
  if (static_cast<int64_t>(soft.size()) != int64_t{f.num_soft_tokens} * text_hidden_)
    throw Error(fmt::format("{}: the audio tower gave {} values for {} soft tokens of {}", input.where, soft.size(),
                            f.num_soft_tokens, text_hidden_));
  return soft;
}

std::vector<SoftTokens> MediaPrompt::soft_tokens() const {
  std::vector<SoftTokens> out;
  for (const MediaSpan& s : spans) out.push_back({s.first, s.embeddings, s.vision});
  return out;
}

MediaPrompt expand_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
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
    span.embeddings = span.vision ? towers.encode_image(input) : towers.encode_audio(input);
    const int64_t count = static_cast<int64_t>(span.embeddings.size()) / towers.text_hidden();
    out.tokens.push_back(markers[k].begin);
    span.first = static_cast<int64_t>(out.tokens.size());
    out.tokens.insert(out.tokens.end(), count, markers[k].placeholder);
    out.tokens.push_back(markers[k].end);
    out.spans.push_back(std::move(span));
  }
  for (int k = 0; k < 2; ++k)
    if (next[k] != items[k].size())
      throw Error(fmt::format("{}: the chat template wrote no {} marker for this part", items[k][next[k]]->where,
                              media::media_kind_name(kinds[k])));
  return out;
}

}  // namespace qs
