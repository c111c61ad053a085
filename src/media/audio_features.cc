#include "media/audio_features.h"

#include <fftw3.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "media/audio_decode.h"
#include "media/mel_filter_bank.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/file.h"

namespace qs::media {
namespace {

using json = nlohmann::json;

constexpr int kMaxFeatureSize = 4096;
constexpr double kMaxFrameMs = 1000.0;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// One field of a feature_extractor block: absent keeps the default, a wrong type is an error naming the field.
class FieldReader {
 public:
  FieldReader(const json& block, std::string label) : block_(block), label_(std::move(label)) {}

  template <typename T>
  void read(const char* field, T& value) const {
    const auto it = block_.find(field);
    if (it == block_.end() || it->is_null()) return;
    const bool ok = std::is_same_v<T, bool> ? it->is_boolean()
                    : std::is_integral_v<T> ? it->is_number_integer()
                                            : it->is_number();
    if (!ok) fail(field, fmt::format("is {}, expected {}", it->type_name(), std::is_same_v<T, bool> ? "a boolean"
                                                                         : std::is_integral_v<T> ? "an integer"
                                                                                                 : "a number"));
    value = it->get<T>();
  }

  void read_list(const char* field, std::vector<double>& values) const {
    const auto it = block_.find(field);
    if (it == block_.end() || it->is_null()) return;
    if (!it->is_array()) fail(field, fmt::format("is {}, expected a list of numbers", it->type_name()));
    for (const json& v : *it) {
      if (!v.is_number()) fail(field, "holds a non-number, expected a list of numbers");
      values.push_back(v.get<double>());
    }
  }

  // Keys the extractor writes when saved but recomputes when loaded: a value that disagrees would be ignored by
  // transformers, so it is refused rather than silently overridden.
  void check_derived(const char* field, int derived, const char* from) const {
    const auto it = block_.find(field);
    if (it == block_.end() || it->is_null()) return;
    if (!it->is_number_integer() || it->get<int64_t>() != derived)
      fail(field, fmt::format("is {}, but transformers derives {} from {}", it->dump(), derived, from));
  }

  [[noreturn]] void fail(const char* field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}' {}", label_, field, what));
  }

 private:
  const json& block_;
  std::string label_;
};

void validate(const AudioFeatureOptions& o, const std::string& label) {
  auto fail = [&](const std::string& what) { throw Error(fmt::format("{}: {}", label, what)); };
  if (o.feature_size < 1 || o.feature_size > kMaxFeatureSize)
    fail(fmt::format("feature_size {} is not in 1..{}", o.feature_size, kMaxFeatureSize));
  if (o.sampling_rate < 1) fail(fmt::format("sampling_rate {} is not positive", o.sampling_rate));
  if (!(o.frame_length_ms > 0 && o.frame_length_ms <= kMaxFrameMs) || o.frame_length() < 2)
    fail(fmt::format("frame_length_ms {} gives no usable frame", o.frame_length_ms));
  if (!(o.hop_length_ms > 0 && o.hop_length_ms <= kMaxFrameMs) || o.hop_length() < 1)
    fail(fmt::format("hop_length_ms {} gives no usable hop", o.hop_length_ms));
  if (!(o.min_frequency >= 0 && o.min_frequency <= o.max_frequency))
    fail(fmt::format("min_frequency {} and max_frequency {} are not 0 <= min <= max", o.min_frequency,
                     o.max_frequency));
  if (!(o.mel_floor > 0)) fail(fmt::format("mel_floor {} is not positive", o.mel_floor));
  if (!std::isfinite(o.preemphasis) || !std::isfinite(o.input_scale_factor) || !std::isfinite(o.padding_value))
    fail("preemphasis, input_scale_factor and padding_value must be finite");
  for (const auto* bins : {&o.per_bin_mean, &o.per_bin_stddev})
    if (!bins->empty() && static_cast<int>(bins->size()) != o.feature_size)
      fail(fmt::format("per_bin_mean/per_bin_stddev have {} values, expected feature_size = {}", bins->size(),
                       o.feature_size));
  for (double s : o.per_bin_stddev)
    if (!(s != 0 && std::isfinite(s))) fail("per_bin_stddev holds 0 or a non-finite value");
  if (o.max_samples < 1 || o.pad_to_multiple_of < 1) fail("max_samples and pad_to_multiple_of must be positive");
}

AudioFeatureOptions options_from_block(const json& block, const std::string& label) {
  if (!block.is_object()) throw Error(fmt::format("{}: expected a JSON object", label));
  const FieldReader r(block, label);
  AudioFeatureOptions o;
  r.read("feature_size", o.feature_size);
  r.read("sampling_rate", o.sampling_rate);
  r.read("padding_value", o.padding_value);
  r.read("frame_length_ms", o.frame_length_ms);
  r.read("hop_length_ms", o.hop_length_ms);
  r.read("min_frequency", o.min_frequency);
  r.read("max_frequency", o.max_frequency);
  r.read("preemphasis", o.preemphasis);
  r.read("preemphasis_htk_flavor", o.preemphasis_htk_flavor);
  r.read("fft_overdrive", o.fft_overdrive);
  r.read("input_scale_factor", o.input_scale_factor);
  r.read("mel_floor", o.mel_floor);
  r.read_list("per_bin_mean", o.per_bin_mean);
  r.read_list("per_bin_stddev", o.per_bin_stddev);
  double dither = 0;
  r.read("dither", dither);
  if (dither != 0) r.fail("dither", fmt::format("is {}; only 0 is supported (random noise is not reproducible)", dither));
  if (const auto side = block.find("padding_side"); side != block.end() && *side != "right")
    r.fail("padding_side", fmt::format("is {}, expected \"right\"", side->dump()));
  if (o.sampling_rate != kAudioSampleRate)
    r.fail("sampling_rate", fmt::format("is {}, but decode_audio delivers {} Hz", o.sampling_rate, kAudioSampleRate));
  validate(o, label);
  r.check_derived("frame_length", o.frame_length(), "frame_length_ms");
  r.check_derived("hop_length", o.hop_length(), "hop_length_ms");
  r.check_derived("fft_length", o.fft_length(), "frame_length_ms and fft_overdrive");
  return o;
}

// FFTW's planner is not thread-safe (executing a plan is): plans are made one at a time.
std::mutex fftw_planner_mutex;

struct FftwFree {
  void operator()(void* p) const { fftw_free(p); }
};
struct FftwPlanDestroy {
  void operator()(fftw_plan p) const {
    std::lock_guard lock(fftw_planner_mutex);
    fftw_destroy_plan(p);
  }
};

// A real-to-complex FFT of `size` points in float64, planned with FFTW_ESTIMATE (no timing runs, so the same
// plan, and the same bits, every time).
class RealFft {
 public:
  explicit RealFft(int size)
      : size_(size),
        in_(static_cast<double*>(fftw_malloc(sizeof(double) * size))),
        out_(static_cast<fftw_complex*>(fftw_malloc(sizeof(fftw_complex) * (size / 2 + 1)))) {
    if (!in_ || !out_) throw Error("audio features: out of memory for the FFT buffers");
    std::lock_guard lock(fftw_planner_mutex);
    plan_.reset(fftw_plan_dft_r2c_1d(size, in_.get(), out_.get(), FFTW_ESTIMATE));
    if (!plan_) throw Error(fmt::format("audio features: FFTW cannot plan a {}-point FFT", size));
  }

  double* input() { return in_.get(); }
  // |X[k]| for k = 0..size/2 into `magnitude`.
  void magnitudes(std::vector<double>& magnitude) {
    fftw_execute(plan_.get());
    for (int k = 0; k <= size_ / 2; ++k) magnitude[k] = std::hypot(out_.get()[k][0], out_.get()[k][1]);
  }

 private:
  int size_;
  std::unique_ptr<double, FftwFree> in_;
  std::unique_ptr<fftw_complex, FftwFree> out_;
  std::unique_ptr<std::remove_pointer_t<fftw_plan>, FftwPlanDestroy> plan_;
};

// The clip as the extractor pads it: cut to max_samples (rounded up to the padding multiple, as transformers'
// _truncate does), padded with padding_value to a multiple of pad_to_multiple_of, scaled, and preceded by
// frame_length / 2 zeros (semicausal padding). Returns the samples and the count of real ones.
std::pair<std::vector<float>, int64_t> padded_signal(std::span<const float> waveform, const AudioFeatureOptions& o) {
  const int64_t real = std::min<int64_t>(static_cast<int64_t>(waveform.size()),
                                         round_up(o.max_samples, o.pad_to_multiple_of));
  const int64_t padded = round_up(real, o.pad_to_multiple_of);
  const int64_t left = o.frame_length() / 2;
  std::vector<float> x(static_cast<size_t>(left + padded), 0.0f);
  const auto scale = static_cast<float>(o.input_scale_factor);
  for (int64_t i = 0; i < padded; ++i) {
    const float v = i < real ? waveform[i] : static_cast<float>(o.padding_value);
    x[left + i] = o.input_scale_factor != 1.0 ? v * scale : v;
  }
  return {std::move(x), real};
}

// One frame before the window: frame_length samples from frame_length + 1 starting at `s`, with the optional
// pre-emphasis, in float32 as numpy computes it on float32 frames.
void frame_samples(const float* s, const AudioFeatureOptions& o, std::vector<float>& frame) {
  const int n = o.frame_length();
  if (o.preemphasis <= 0.0) {
    std::copy(s, s + n, frame.begin());
    return;
  }
  const auto p = static_cast<float>(o.preemphasis);
  if (o.preemphasis_htk_flavor) {
    frame[0] = s[0] * static_cast<float>(1.0 - o.preemphasis);
    for (int k = 1; k < n; ++k) frame[k] = s[k] - p * s[k - 1];
  } else {
    for (int k = 0; k < n; ++k) frame[k] = s[k + 1] - p * s[k];
  }
}

// Gemma4Processor.replace_audio_token: the mask through two stride-2, kernel-3, padding-1 convolutions
// (mask[::2][:t_out] twice), counting what stays valid.
int count_soft_tokens(std::vector<uint8_t> mask) {
  for (int layer = 0; layer < 2; ++layer) {
    const size_t t_out = mask.empty() ? 0 : (mask.size() - 1) / 2 + 1;
    std::vector<uint8_t> next;
    for (size_t i = 0; i < mask.size() && next.size() < t_out; i += 2) next.push_back(mask[i]);
    mask = std::move(next);
  }
  int n = 0;
  for (uint8_t m : mask) n += m;
  return n;
}

}  // namespace

std::string expand_audio_placeholder(int num_soft_tokens) {
  std::string s(kBeginAudio);
  s.reserve(s.size() + num_soft_tokens * kAudioSoftToken.size() + kEndAudio.size());
  for (int i = 0; i < num_soft_tokens; ++i) s += kAudioSoftToken;
  s += kEndAudio;
  return s;
}

int AudioFeatureOptions::frame_length() const {
  return static_cast<int>(std::lround(sampling_rate * frame_length_ms / 1000.0));
}
int AudioFeatureOptions::hop_length() const {
  return static_cast<int>(std::lround(sampling_rate * hop_length_ms / 1000.0));
}
int AudioFeatureOptions::fft_length() const {
  int n = 1;
  while (n < frame_length()) n *= 2;
  return fft_overdrive ? 2 * n : n;
}

AudioFeatureOptions read_audio_feature_options(const std::filesystem::path& model_dir) {
  const std::filesystem::path processor = model_dir / "processor_config.json";
  if (std::filesystem::exists(processor)) {
    const json config = read_json_file<json>(processor);
    if (!config.is_object()) throw Error(fmt::format("{}: expected a JSON object", processor.string()));
    if (const auto block = config.find("feature_extractor"); block != config.end())
      return options_from_block(*block, processor.string() + " feature_extractor");
  }
  const std::filesystem::path legacy = model_dir / "preprocessor_config.json";
  if (std::filesystem::exists(legacy)) {
    const json config = read_json_file<json>(legacy);
    if (config.is_object() && config.value("feature_extractor_type", "") == "Gemma4AudioFeatureExtractor")
      return options_from_block(config, legacy.string());
  }
  return AudioFeatureOptions{};
}

AudioFeatures extract_audio_features(std::span<const float> waveform, const AudioFeatureOptions& o) {
  validate(o, "audio feature options");
  const int frame_length = o.frame_length(), hop = o.hop_length(), fft_length = o.fft_length();
  const int bins = fft_length / 2 + 1;
  const auto [x, real] = padded_signal(waveform, o);
  const int64_t window_span = frame_length + 1;  // the extractor unfolds frame_length + 1 samples per frame
  const int64_t total = static_cast<int64_t>(x.size());

  AudioFeatures out;
  out.num_mel = o.feature_size;
  out.num_frames = total < window_span ? 0 : static_cast<int>((total - window_span) / hop + 1);
  out.features.assign(static_cast<size_t>(out.num_frames) * o.feature_size, 0.0f);
  out.mask.assign(out.num_frames, 0);

  // float32 window, as the extractor stores it; filters in float64 (the product with float32 magnitudes is
  // float64 in numpy, and so are the log and the normalisation).
  std::vector<float> window;
  for (double w : periodic_hann_window(frame_length)) window.push_back(static_cast<float>(w));
  const std::vector<double> bank = htk_mel_filter_bank(bins, o.feature_size, o.min_frequency, o.max_frequency,
                                                       o.sampling_rate);
  RealFft fft(fft_length);
  std::vector<float> frame(frame_length);
  std::vector<double> magnitude(bins), mel(o.feature_size);
  const int64_t left = frame_length / 2;
  for (int t = 0; t < out.num_frames; ++t) {
    const int64_t start = static_cast<int64_t>(t) * hop;
    // Valid when the last sample the frame unfolds is real audio.
    if (start + frame_length - left >= real) continue;  // invalid frames stay 0, as features * mask
    out.mask[t] = 1;
    frame_samples(x.data() + start, o, frame);
    double* in = fft.input();
    for (int k = 0; k < frame_length; ++k) in[k] = frame[k] * window[k];  // float32 product, then widened
    std::fill(in + frame_length, in + fft_length, 0.0);
    fft.magnitudes(magnitude);
    std::fill(mel.begin(), mel.end(), 0.0);
    for (int f = 0; f < bins; ++f) {
      const double* row = bank.data() + static_cast<size_t>(f) * o.feature_size;
      for (int m = 0; m < o.feature_size; ++m) mel[m] += magnitude[f] * row[m];
    }
    float* dst = out.features.data() + static_cast<size_t>(t) * o.feature_size;
    for (int m = 0; m < o.feature_size; ++m) {
      double v = std::log(mel[m] + o.mel_floor);
      if (!o.per_bin_mean.empty()) v -= o.per_bin_mean[m];
      if (!o.per_bin_stddev.empty()) v /= o.per_bin_stddev[m];
      dst[m] = static_cast<float>(v);
    }
  }
  out.num_soft_tokens = count_soft_tokens(out.mask);
  return out;
}

AudioFeatures waveform_frames(std::span<const float> waveform, int samples_per_token) {
  if (samples_per_token <= 0) throw Error(fmt::format("audio frames of {} samples", samples_per_token));
  AudioFeatures out;
  out.num_mel = samples_per_token;
  out.num_frames = static_cast<int>((waveform.size() + samples_per_token - 1) / samples_per_token);
  out.features.assign(static_cast<size_t>(out.num_frames) * samples_per_token, 0.0f);
  std::copy(waveform.begin(), waveform.end(), out.features.begin());
  out.mask.assign(out.num_frames, 1);
  out.num_soft_tokens = out.num_frames;
  return out;
}

}  // namespace qs::media
