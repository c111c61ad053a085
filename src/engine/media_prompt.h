#pragma once
// A chat prompt's media turned into what the text model reads: Gemma4Processor's expansion of each media marker the
// chat template writes ("<|image|>", "<|audio|>") into begin + one placeholder per soft token + end, and the soft
// tokens themselves, from the encoded bytes through decoding, the processor's preprocessing and the checkpoint's
// vision or audio tower. Every error names the request part the media came from (MediaInput::where).
//
// Two stages, so a server can split them across threads: prepare_media_prompt (decoding and preprocessing: cheap,
// and where bad input fails) gives the expanded prompt with spans that hold the tower's input; encode_media_span
// (the tower's forward pass: heavy) fills in their soft tokens. expand_media_prompt does both at once.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "media/audio_features.h"
#include "media/image_processor.h"
#include "media/media_input.h"
#include "model/gemma4.h"

namespace qs {

class Gemma4AudioEncoder;
class Gemma4UnifiedAudioEmbedder;
class Gemma4UnifiedVisionEmbedder;
class Gemma4VisionTower;
class LoraAdapter;
class Tokenizer;

// Identifies a media item by its content (a 128-bit hash of its kind, image budget and encoded bytes): the key of the engine's
// soft-token cache and of the prefix-cache blocks under its placeholders.
struct MediaKey {
  uint64_t hi = 0, lo = 0;
  bool operator==(const MediaKey&) const = default;
};
MediaKey media_key(const media::MediaInput& input);

// An image's patches or a clip's log-mel frames (the 12B: its waveform frames), as its tower reads them.
struct PreparedMedia {
  media::MediaKind kind = media::MediaKind::Image;
  std::string where;                // the request part, for errors
  media::PreprocessedImage image;   // kind Image
  media::AudioFeatures audio;       // kind Audio
  int64_t soft_tokens() const;
};

// The towers of a checkpoint, loaded beside its text model (which must outlive them), with the processor settings
// of its processor_config.json. A checkpoint without a vision_config (audio_config) has no vision (audio) tower.
// The 12B (gemma4_unified) has encoder-free embedders in their place, and its processor's variants: images as
// Gemma4UnifiedImageProcessor prepares them, audio as raw 640-sample frames.
class MediaTowers {
 public:
  static MediaTowers load(const Gemma4Model& model, const std::filesystem::path& dir);
  MediaTowers(MediaTowers&&) noexcept;
  MediaTowers& operator=(MediaTowers&&) noexcept;
  ~MediaTowers();

  bool images() const { return vision_ != nullptr || unified_vision_ != nullptr; }
  bool audio() const { return audio_ != nullptr || unified_audio_ != nullptr; }
  int64_t text_hidden() const { return text_hidden_; }
  // The processor's image budget (processor_config.json's max_soft_tokens): what an image without its own gets.
  int image_soft_tokens() const { return image_options_.max_soft_tokens; }

  // One item decoded and preprocessed as the processor does: what its tower reads. Throws naming input.where.
  std::shared_ptr<const PreparedMedia> prepare(const media::MediaInput& input) const;
  // Its soft tokens [soft tokens, text hidden]: the tower's forward pass, with `lora`'s vision-tower linears
  // when it has any (model/lora_adapter.h).
  std::vector<float> encode(const PreparedMedia& prepared, const LoraAdapter* lora = nullptr) const;

 private:
  MediaTowers() = default;
  std::unique_ptr<Gemma4VisionTower> vision_;
  std::unique_ptr<Gemma4AudioEncoder> audio_;
  std::unique_ptr<Gemma4UnifiedVisionEmbedder> unified_vision_;
  std::unique_ptr<Gemma4UnifiedAudioEmbedder> unified_audio_;
  media::ImageProcessorOptions image_options_;
  media::AudioFeatureOptions audio_options_;
  int64_t text_hidden_ = 0;
};

// One media item's soft tokens in an expanded prompt.
struct MediaSpan {
  int64_t first = 0;   // index in the prompt of its first placeholder
  int64_t count = 0;   // soft tokens (placeholders)
  bool vision = false;
  MediaKey key;
  std::shared_ptr<const PreparedMedia> prepared;  // the tower's input, until encoded
  std::vector<float> embeddings;                  // [count, text hidden]; empty until encoded
};

struct MediaPrompt {
  std::vector<int32_t> tokens;   // the processor's input ids
  std::vector<MediaSpan> spans;  // ascending

  // The spans as the model's forward pass takes them for a step holding the whole prompt (views of `spans`).
  std::vector<SoftTokens> soft_tokens() const;
};

// `tokens`: the templated prompt, with one marker token per media item, in the order of `inputs` per kind.
// Throws qs::Error when the markers and the items do not pair up, when a kind has no tower, or (naming the item's
// `where`) when an item does not decode. The spans hold their prepared input, not yet their soft tokens.
MediaPrompt prepare_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
                                 const MediaTowers& towers, const Tokenizer& tokenizer);
// A prepared span's soft tokens, from its tower (its prepared input is then released).
void encode_media_span(MediaSpan& span, const MediaTowers& towers, const LoraAdapter* lora = nullptr);
// Both: every span encoded.
MediaPrompt expand_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
                                const MediaTowers& towers, const Tokenizer& tokenizer,
                                const LoraAdapter* lora = nullptr);
// The media cache's key of an item encoded for a sequence using `lora`: its own when the adapter leaves the towers
// alone, else salted with the adapter's id (the soft tokens differ).
MediaKey media_key_under(const MediaKey& key, const LoraAdapter* lora);

}  // namespace qs
