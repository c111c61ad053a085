// Audio decoding (libsndfile from memory, mono mix-down, libsoxr HQ to 16 kHz) against transformers' `load_audio`
// (soundfile's own libsndfile build + the soxr package): tests/data/audio/* and tests/golden/audio/decoded.safetensors
// come from tools/python/make_audio_golden.py; the live check is ctest audio_external. And bad input: every
// failure is a qs::Error naming the part.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/safetensors.h"
#include "media/audio_decode.h"
#include "test_util.h"
#include "util/error.h"
#include "util/file.h"

namespace qs::media {
namespace {

const std::filesystem::path kData = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/data/audio";
const std::filesystem::path kGolden = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/golden/audio";
constexpr AudioLimits kLimits{.max_bytes = 1 << 20, .max_seconds = 60.0};

std::vector<uint8_t> bytes_of(const std::string& name) {
  const std::string s = read_file(kData / name);
  return {s.begin(), s.end()};
}

std::string error_of(std::span<const uint8_t> bytes, std::string_view hint, AudioLimits limits = kLimits) {
  try {
    decode_audio(bytes, hint, limits, "messages[0].content[1]");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AudioDecode, MatchesTransformersLoadAudio) {
  const SafetensorsFile golden = SafetensorsFile::open(kGolden / "decoded.safetensors");
  for (const TensorEntry& t : golden.tensors()) {
    const std::string hint = std::filesystem::path(t.name).extension().string().substr(1);
    const std::vector<float> ours = decode_audio(bytes_of(t.name), hint, kLimits, t.name);
    const auto expected = test::read_tensor<float>(golden, t.name);
    ASSERT_EQ(ours.size(), expected.size()) << t.name;
    double worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, double(std::abs(ours[i] - expected[i])));
    std::printf("%-26s %5zu samples, max |difference| %.2e\n", t.name.c_str(), ours.size(), worst);
    EXPECT_LE(worst, 1e-5) << t.name;
  }
}

// A canonical 44-byte-header WAV of IEEE float samples (interleaved when channels > 1).
std::vector<uint8_t> float_wav(uint32_t rate, const std::vector<float>& samples, uint16_t channels = 1) {
  std::vector<uint8_t> out;
  const auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  const auto u32 = [&](uint32_t v) { put(&v, 4); };
  const auto u16 = [&](uint16_t v) { put(&v, 2); };
  const uint32_t data_bytes = static_cast<uint32_t>(samples.size() * 4);
  put("RIFF", 4), u32(36 + data_bytes), put("WAVE", 4), put("fmt ", 4), u32(16);
  u16(3), u16(channels), u32(rate), u32(rate * 4 * channels), u16(4 * channels), u16(32);  // IEEE float, 32-bit
  put("data", 4), u32(data_bytes), put(samples.data(), data_bytes);
  return out;
}

TEST(AudioDecode, RefusesSamplesThatAreNotFinite) {
  // Found by audio_decode_fuzz: finite float samples near the float32 limit overflow in soxr's float32 filter.
  std::vector<float> loud(2000, 2.5e38f);
  for (size_t i = 1; i < loud.size(); i += 2) loud[i] = -2.5e38f;
  EXPECT_NE(error_of(float_wav(11025, loud), "wav").find("non-finite samples after resampling"), std::string::npos);
  std::vector<float> with_nan(2000, 0.1f);
  with_nan[7] = std::nanf("");
  EXPECT_NE(error_of(float_wav(16000, with_nan), "wav").find("non-finite samples (float"), std::string::npos);
  EXPECT_EQ(error_of(float_wav(16000, std::vector<float>(2000, 0.25f)), "wav"), "");
}

TEST(AudioDecode, RefusesImplausibleHeaders) {
  EXPECT_NE(error_of(float_wav(16000, std::vector<float>(2000, 0.1f), 100), "wav").find("100 channels (expected 1 to 64)"),
            std::string::npos);
  EXPECT_NE(error_of(float_wav(100, std::vector<float>(2000, 0.1f)), "wav").find("sample rate 100 Hz"),
            std::string::npos);
  EXPECT_EQ(error_of(float_wav(16000, std::vector<float>(2000, 0.1f), 2), "wav"), "");
}

TEST(AudioDecode, SniffsContainers) {
  for (const auto& [name, format] : std::vector<std::pair<std::string, std::string>>{
           {"pcm16_mono_16k.wav", "wav"}, {"pcm24_mono_8k.flac", "flac"}, {"vorbis_stereo_48k.ogg", "ogg"},
           {"opus_mono_48k.opus", "opus"}, {"mp3_mono_22k05.mp3", "mp3"}})
    EXPECT_EQ(sniff_audio_format(bytes_of(name)), format) << name;
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(sniff_audio_format(png), "");
}

TEST(AudioDecode, DeclaredFormatMustMatchTheBytes) {
  const auto wav = bytes_of("pcm16_mono_16k.wav");
  EXPECT_EQ(error_of(wav, "mp3"), "messages[0].content[1]: declared format 'mp3' but the bytes are wav");
  EXPECT_EQ(error_of(wav, ""), "");
  EXPECT_EQ(error_of(bytes_of("opus_mono_48k.opus"), "ogg"), "");  // Opus in an Ogg container
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  EXPECT_NE(error_of(text, "wav").find("not a WAV, FLAC, Ogg Vorbis, Opus or MP3 file"), std::string::npos);
}

TEST(AudioDecode, RefusesEmptyTruncatedAndCorruptBytes) {
  EXPECT_EQ(error_of({}, "wav"), "messages[0].content[1]: empty audio data");
  for (const std::string name : {"pcm16_mono_16k.wav", "pcm24_mono_8k.flac", "vorbis_stereo_48k.ogg",
                                 "opus_mono_48k.opus", "mp3_mono_22k05.mp3"}) {
    const auto whole = bytes_of(name);
    for (size_t keep : {size_t{4}, size_t{12}, size_t{44}}) {
      const std::string error = error_of(std::span(whole.data(), keep), "");
      EXPECT_TRUE(error.starts_with("messages[0].content[1]: ")) << name << " cut to " << keep << ": " << error;
    }
    // Cut in the middle: a FLAC stream states its length, so that is an error; libsndfile reads a WAV whose data
    // chunk overruns the file, and a cut Ogg or MP3 stream, as the shorter audio that is there (as soundfile does).
    const std::string error = error_of(std::span(whole.data(), whole.size() / 2), "");
    if (name.ends_with(".flac"))
      EXPECT_TRUE(error.starts_with("messages[0].content[1]: ")) << name << ": " << error;
    else
      EXPECT_TRUE(error.empty() || error.starts_with("messages[0].content[1]: ")) << name << ": " << error;
    std::vector<uint8_t> corrupt = whole;  // the magic kept, everything after it noise
    for (size_t i = 16; i < corrupt.size(); ++i) corrupt[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    try {
      decode_audio(corrupt, "", kLimits, "part");  // may decode noise, or fail: never crash
    } catch (const Error& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with("part: ")) << e.what();
    }
  }
}

TEST(AudioDecode, EnforcesLimitsBeforeDecoding) {
  const auto wav = bytes_of("pcm16_mono_16k.wav");  // 0.25 s
  EXPECT_NE(error_of(wav, "wav", {.max_bytes = 1000, .max_seconds = 60}).find("8044 bytes of audio, more than the 1000"),
            std::string::npos);
  EXPECT_NE(error_of(wav, "wav", {.max_bytes = 1 << 20, .max_seconds = 0.1}).find("0.2 s of audio, more than the 0.1 s"),
            std::string::npos);
  // A WAV header declaring a huge data chunk over a few bytes of data is refused, not trusted.
  std::vector<uint8_t> huge = wav;
  const uint32_t size = 0x7fffff00u;
  std::memcpy(huge.data() + 40, &size, 4);  // the "data" chunk size of a canonical 44-byte header
  const std::string error = error_of(huge, "wav");
  EXPECT_TRUE(error.empty() || error.starts_with("messages[0].content[1]: ")) << error;
}

}  // namespace
}  // namespace qs::media
