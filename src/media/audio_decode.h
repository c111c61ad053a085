#pragma once
// Audio input for the audio tower: WAV, FLAC, Ogg (Vorbis, Opus) and MP3 bytes decoded by libsndfile from memory,
// mixed down to mono and resampled to the 16 kHz the Gemma 4 feature extractor expects, the way Hugging Face's
// `load_audio` does (soundfile + soxr 'soxr_hq'). Untrusted bytes: every failure is a qs::Error naming `what`.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace qs::media {

// Sample rate of decode_audio's output (Gemma4AudioFeatureExtractor's sampling_rate).
inline constexpr int kAudioSampleRate = 16000;

struct AudioLimits {
  int64_t max_bytes = 0;     // encoded size
  double max_seconds = 0.0;  // decoded duration, checked from the header and again while decoding
};

// The container the bytes start with: "wav", "flac", "ogg" (Vorbis), "opus", "mp3", or "" when none of these.
std::string_view sniff_audio_format(std::span<const uint8_t> bytes);

// Decodes `bytes` to mono float32 at kAudioSampleRate. `format_hint` ("wav", "mp3", "flac", "ogg", "opus"; "" for
// any) must agree with the bytes' own container. Channels are averaged; other rates go through libsoxr at
// 'soxr_hq' quality, and the result is ceil(frames * 16000 / rate) samples long, as librosa and Hugging Face give.
std::vector<float> decode_audio(std::span<const uint8_t> bytes, std::string_view format_hint, const AudioLimits& limits,
                                std::string_view what);

}  // namespace qs::media
