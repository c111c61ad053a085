#pragma once
// A chat prompt's media turned into what the text model reads: Gemma4Processor's expansion of each media marker the
// chat template writes ("<|image|>", "<|audio|>") into begin + one placeholder per soft token + end, and the soft
// tokens themselves, from the encoded bytes through decoding, the processor's preprocessing and the checkpoint's
// vision or audio tower. Every error names the request part the media came from (MediaInput::where).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "media/audio_features.h"
#include "media/image_processor.h"
#include "media/media_input.h"
#include "model/gemma4.h"

namespace qs {

class Gemma4AudioEncoder;
class Gemma4VisionTower;
class Tokenizer;

// The towers of a checkpoint, loaded beside its text model (which must outlive them), with the processor settings
// of its processor_config.json. A checkpoint without a vision_config (audio_config) has no vision (audio) tower.
class MediaTowers {
 public:
  static MediaTowers load(const Gemma4Model& model, const std::filesystem::path& dir);
  MediaTowers(MediaTowers&&) noexcept;
  MediaTowers& operator=(MediaTowers&&) noexcept;
  ~MediaTowers();

  bool images() const { return vision_ != nullptr; }
  bool audio() const { return audio_ != nullptr; }
  int64_t text_hidden() const { return text_hidden_; }

  // One image's soft tokens [count, text hidden] from its encoded bytes.
  std::vector<float> encode_image(const media::MediaInput& input) const;
  // One clip's soft tokens [count, text hidden] from its encoded bytes.
  std::vector<float> encode_audio(const media::MediaInput& input) const;

 private:
  MediaTowers() = default;
  std::unique_ptr<Gemma4VisionTower> vision_;
  std::unique_ptr<Gemma4AudioEncoder> audio_;
  media::ImageProcessorOptions image_options_;
  media::AudioFeatureOptions audio_options_;
  int64_t text_hidden_ = 0;
};

// One media item's soft tokens in an expanded prompt.
struct MediaSpan {
  int64_t first = 0;             // index in the prompt of its first placeholder
  std::vector<float> embeddings;  // [count, text hidden]
  bool vision = false;
};

struct MediaPrompt {
  std::vector<int32_t> tokens;   // the processor's input ids
  std::vector<MediaSpan> spans;  // ascending

  // The spans as the model's forward pass takes them for a step holding the whole prompt (views of `spans`).
  std::vector<SoftTokens> soft_tokens() const;
};

// `tokens`: the templated prompt, with one marker token per media item, in the order of `inputs` per kind.
// Throws qs::Error when the markers and the items do not pair up, when a kind has no tower, or (naming the item's
// `where`) when an item does not decode.
MediaPrompt expand_media_prompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs,
                                const MediaTowers& towers, const Tokenizer& tokenizer);

}  // namespace qs
