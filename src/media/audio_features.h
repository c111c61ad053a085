#pragma once
// Gemma 4's audio features, as transformers' Gemma4AudioFeatureExtractor (feature_extraction_gemma4.py) computes
// them for one clip: log-mel frames with semicausal padding, the per-frame validity mask, and the number of audio
// soft tokens Gemma4Processor puts between the <|audio> and <audio|> markers.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qs::media {

// The chat template writes kAudioSoftToken once for an audio part; the processor expands it to
// kBeginAudio + num_soft_tokens x kAudioSoftToken + kEndAudio (expand_audio_placeholder).
inline constexpr std::string_view kAudioSoftToken = "<|audio|>";
inline constexpr std::string_view kBeginAudio = "<|audio>";
inline constexpr std::string_view kEndAudio = "<audio|>";
std::string expand_audio_placeholder(int num_soft_tokens);

// Gemma4AudioFeatureExtractor's parameters, defaults as its constructor's. dither is refused when non-zero (random
// noise cannot be reproduced).
struct AudioFeatureOptions {
  int feature_size = 128;  // mel bins
  int sampling_rate = 16000;
  double padding_value = 0.0;
  double frame_length_ms = 20.0;
  double hop_length_ms = 10.0;
  double min_frequency = 0.0;
  double max_frequency = 8000.0;
  double preemphasis = 0.0;
  bool preemphasis_htk_flavor = true;
  bool fft_overdrive = false;
  double input_scale_factor = 1.0;
  double mel_floor = 1e-3;
  std::vector<double> per_bin_mean;    // empty or feature_size values
  std::vector<double> per_bin_stddev;  // empty or feature_size values
  // The extractor's call defaults, which Gemma4Processor keeps: clips are cut to max_samples (30 s) and padded with
  // padding_value to a multiple of pad_to_multiple_of samples.
  int64_t max_samples = 480000;
  int pad_to_multiple_of = 128;

  // Derived as the extractor derives them.
  int frame_length() const;  // round(sampling_rate * frame_length_ms / 1000)
  int hop_length() const;
  int fft_length() const;  // next power of two >= frame_length, doubled with fft_overdrive
};

// The "feature_extractor" block of model_dir/processor_config.json (or a legacy preprocessor_config.json holding a
// Gemma4AudioFeatureExtractor); HF defaults for what is absent, and all defaults when neither file has one. Throws
// qs::Error naming the file and field for a wrong type or an unsupported value (a sampling_rate other than
// decode_audio's 16 kHz among them).
AudioFeatureOptions read_audio_feature_options(const std::filesystem::path& model_dir);

struct AudioFeatures {
  int num_frames = 0;
  int num_mel = 0;
  std::vector<float> features;  // [num_frames, num_mel]; 0 in invalid frames
  std::vector<uint8_t> mask;    // [num_frames], 1 = every sample of the frame is real audio (input_features_mask)
  int num_soft_tokens = 0;      // valid positions after the audio tower's two stride-2 convolutions
};

// `waveform` is mono at options.sampling_rate (decode_audio's output).
AudioFeatures extract_audio_features(std::span<const float> waveform, const AudioFeatureOptions& options);

// Gemma4UnifiedAudioFeatureExtractor (the 12B's encoder-free audio): the 16 kHz waveform, zero-padded to whole
// frames of samples_per_token samples, one frame per soft token (num_mel = samples_per_token, every frame valid;
// the whole clip is kept: Gemma4UnifiedProcessor cuts nothing).
AudioFeatures waveform_frames(std::span<const float> waveform, int samples_per_token);

}  // namespace qs::media
