#include "media/audio_decode.h"

#include <fmt/format.h>
#include <sndfile.h>
#include <ogg/ogg.h>
#include <vorbis/vorbisfile.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "media/audio_resample.h"
#include "util/error.h"

namespace qs::media {
namespace {

// Bounds that no real recording crosses; beyond them a header is corrupt or hostile.
constexpr int kMaxChannels = 64;
constexpr int kMinSampleRate = 1000;
constexpr int kMaxSampleRate = 768000;
constexpr sf_count_t kReadBlockFrames = 8192;

bool starts_with(std::span<const uint8_t> bytes, std::string_view magic, size_t at = 0) {
  return bytes.size() >= at + magic.size() && std::memcmp(bytes.data() + at, magic.data(), magic.size()) == 0;
}

// An MPEG-1/2/2.5 audio frame header with layer III: 11 sync bits, a valid version and layer bits 01.
bool is_mp3_frame_header(std::span<const uint8_t> bytes) {
  return bytes.size() >= 4 && bytes[0] == 0xFF && (bytes[1] & 0xE0) == 0xE0 && (bytes[1] & 0x18) != 0x08 &&
         (bytes[1] & 0x06) == 0x02;
}

// Where the audio starts after ID3v2 tags, skipped as libsndfile skips them (versions 2-4; the size counts the bytes
// after the 10-byte header; a tag that reaches the end is not skipped), so that "mp3" means what libsndfile will read
// there is an MPEG frame, never another container (Ogg behind a tag would reach its Vorbis code, which leaks).
size_t after_id3_tags(std::span<const uint8_t> bytes) {
  size_t at = 0;
  while (starts_with(bytes, "ID3", at) && bytes.size() >= at + 10 && bytes[at + 3] >= 2 && bytes[at + 3] <= 4) {
    const size_t size = size_t(bytes[at + 6] & 0x7F) << 21 | size_t(bytes[at + 7] & 0x7F) << 14 |
                        size_t(bytes[at + 8] & 0x7F) << 7 | size_t(bytes[at + 9] & 0x7F);
    if (at + 10 + size >= bytes.size()) break;
    at += 10 + size;
  }
  return at;
}

// The codec of an Ogg stream as libsndfile will see it: the first packet ("\x01vorbis" or "OpusHead") of the first
// page libogg reads, which must start at offset 0 and pass its checksum. (libogg skips a page that fails it: a first
// page that names Opus in its bytes but fails would send libsndfile on to a later Vorbis page, whose failed open
// leaks.) A page is at most 65,307 bytes.
std::string_view ogg_codec(std::span<const uint8_t> bytes) {
  ogg_sync_state sync;
  ogg_sync_init(&sync);
  const size_t n = std::min<size_t>(bytes.size(), 65307);
  std::memcpy(ogg_sync_buffer(&sync, static_cast<long>(n)), bytes.data(), n);
  ogg_sync_wrote(&sync, static_cast<long>(n));
  std::string_view codec;
  ogg_page page;
  if (ogg_sync_pageseek(&sync, &page) > 0 && ogg_page_bos(&page)) {
    ogg_stream_state stream;
    ogg_stream_init(&stream, ogg_page_serialno(&page));
    ogg_packet packet;
    if (ogg_stream_pagein(&stream, &page) == 0 && ogg_stream_packetout(&stream, &packet) == 1) {
      const std::span<const uint8_t> first(packet.packet, static_cast<size_t>(packet.bytes));
      codec = starts_with(first, "OpusHead") ? "opus" : starts_with(first, "\x01vorbis") ? "ogg" : "";
    }
    ogg_stream_clear(&stream);
  }
  ogg_sync_clear(&sync);
  return codec;
}

// libsndfile reads the bytes through these callbacks (sf_open_virtual): nothing touches the file system.
struct MemoryStream {
  std::span<const uint8_t> bytes;
  sf_count_t position = 0;
};

sf_count_t stream_length(void* user) { return static_cast<sf_count_t>(static_cast<MemoryStream*>(user)->bytes.size()); }

sf_count_t stream_seek(sf_count_t offset, int whence, void* user) {
  auto* s = static_cast<MemoryStream*>(user);
  const sf_count_t size = static_cast<sf_count_t>(s->bytes.size());
  sf_count_t base = whence == SEEK_CUR ? s->position : whence == SEEK_END ? size : 0;
  if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END) return -1;
  if (offset < -base || offset > size - base) return -1;  // outside the bytes (and no overflow computing it)
  s->position = base + offset;
  return s->position;
}

sf_count_t stream_read(void* out, sf_count_t count, void* user) {
  auto* s = static_cast<MemoryStream*>(user);
  const sf_count_t size = static_cast<sf_count_t>(s->bytes.size());
  const sf_count_t n = std::clamp<sf_count_t>(std::min(count, size - s->position), 0, size);
  if (n > 0) std::memcpy(out, s->bytes.data() + s->position, static_cast<size_t>(n));
  s->position += n;
  return n;
}

sf_count_t stream_write(const void*, sf_count_t, void*) { return 0; }
sf_count_t stream_tell(void* user) { return static_cast<MemoryStream*>(user)->position; }

// libvorbisfile reads the same bytes as a stream it cannot seek (Ogg Vorbis: see decode_audio for why not
// libsndfile).
size_t vorbis_read(void* out, size_t size, size_t count, void* user) {
  if (size == 0) return 0;
  const sf_count_t bytes = stream_read(out, static_cast<sf_count_t>(size * count), user);
  return static_cast<size_t>(bytes) / size;
}

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using SndfileHandle = std::unique_ptr<SNDFILE, SndfileCloser>;

void check_format_hint(std::string_view hint, std::string_view sniffed, std::string_view what) {
  if (sniffed.empty())
    throw Error(fmt::format("{}: not a WAV, FLAC, Ogg Vorbis, Opus or MP3 file (unrecognised leading bytes)", what));
  // "ogg" names the container: an Ogg file declared as such may carry Opus.
  const bool agrees = hint.empty() || hint == sniffed || (hint == "ogg" && sniffed == "opus");
  if (!agrees) throw Error(fmt::format("{}: declared format '{}' but the bytes are {}", what, hint, sniffed));
}

void check_header(const SF_INFO& info, const AudioLimits& limits, std::string_view what) {
  if (info.channels < 1 || info.channels > kMaxChannels)
    throw Error(fmt::format("{}: {} channels (expected 1 to {})", what, info.channels, kMaxChannels));
  if (info.samplerate < kMinSampleRate || info.samplerate > kMaxSampleRate)
    throw Error(fmt::format("{}: sample rate {} Hz (expected {} to {})", what, info.samplerate, kMinSampleRate,
                            kMaxSampleRate));
  // Some containers cannot state their length (then frames is 0 or huge); the decode loop checks again.
  if (info.frames > 0 && static_cast<double>(info.frames) / info.samplerate > limits.max_seconds)
    throw Error(fmt::format("{}: {:.1f} s of audio, more than the {:.1f} s allowed", what,
                            static_cast<double>(info.frames) / info.samplerate, limits.max_seconds));
}

// Float formats can hold infinities and NaNs, and samples near the float32 limit overflow in the resampler's
// float32 arithmetic: either way nothing meaningful follows.
void require_finite(const std::vector<float>& samples, std::string_view what, std::string_view stage) {
  if (!std::all_of(samples.begin(), samples.end(), [](float v) { return std::isfinite(v); }))
    throw Error(fmt::format("{}: the audio holds non-finite samples{} (float samples far outside [-1, 1])", what, stage));
}

// Appends `frames` frames as mono float32: the channels' sum divided by their count, in float32 (numpy's mean over
// channels of soundfile's float32 frames). sample(i, c) is frame i's channel c.
template <class Sample>
void append_mono(std::vector<float>& mono, int64_t frames, int channels, double max_frames, const AudioLimits& limits,
                 std::string_view what, Sample sample) {
  if (static_cast<double>(mono.size()) + static_cast<double>(frames) > max_frames)  // as double: any limit is safe
    throw Error(fmt::format("{}: more than the {:.1f} s of audio allowed", what, limits.max_seconds));
  for (int64_t i = 0; i < frames; ++i) {
    float sum = sample(i, 0);
    for (int c = 1; c < channels; ++c) sum += sample(i, c);
    mono.push_back(channels == 1 ? sum : sum / static_cast<float>(channels));
  }
}

std::vector<float> read_mono(SNDFILE* file, const SF_INFO& info, const AudioLimits& limits, std::string_view what) {
  const int channels = info.channels;
  std::vector<float> block(static_cast<size_t>(kReadBlockFrames * channels));
  std::vector<float> mono;
  for (;;) {
    const sf_count_t got = sf_readf_float(file, block.data(), kReadBlockFrames);
    if (got <= 0) break;
    append_mono(mono, got, channels, limits.max_seconds * info.samplerate, limits, what,
                [&](int64_t i, int c) { return block[static_cast<size_t>(i * channels + c)]; });
  }
  if (sf_error(file) != SF_ERR_NO_ERROR)
    throw Error(fmt::format("{}: corrupt audio data ({})", what, sf_strerror(file)));
  if (mono.empty()) throw Error(fmt::format("{}: the file holds no audio samples", what));
  // A FLAC stream states its exact length; fewer frames means the bytes were cut. (libsndfile sizes a WAV's data
  // from what the file holds; MP3 and Ogg lengths come from the stream itself, so a cut one is only shorter.)
  if ((info.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_FLAC && static_cast<sf_count_t>(mono.size()) < info.frames)
    throw Error(fmt::format("{}: truncated audio: the header declares {} frames, the data holds {}", what, info.frames,
                            mono.size()));
  require_finite(mono, what, "");
  return mono;
}

struct VorbisFile {
  OggVorbis_File file{};
  ~VorbisFile() { ov_clear(&file); }
};

// Ogg Vorbis through libvorbisfile, which frees everything it allocated on every path (ov_clear; a failed open
// clears itself). The same decoder as libsndfile's (libvorbis), so the same float samples; and, as libsndfile (so
// soundfile and transformers' load_audio) reads it, only the first link of a chained stream. Opened unseekable, so
// that it never reads the other links' headers (seekable, it would read every link's up front: codebooks for each
// of thousands of tiny links in a hostile file); the length is checked while decoding. `rate` receives the rate.
std::vector<float> read_vorbis_mono(std::span<const uint8_t> bytes, const AudioLimits& limits, std::string_view what,
                                    int& rate) {
  MemoryStream stream{bytes};
  VorbisFile vorbis;
  if (ov_open_callbacks(&stream, &vorbis.file, nullptr, 0, {vorbis_read, nullptr, nullptr, nullptr}) < 0)
    throw Error(fmt::format("{}: cannot decode the audio (not a valid Ogg Vorbis stream)", what));
  const vorbis_info* header = ov_info(&vorbis.file, -1);
  SF_INFO info{};
  info.channels = header->channels;
  info.samplerate = static_cast<int>(std::clamp<long>(header->rate, 0, kMaxSampleRate + 1));
  check_header(info, limits, what);
  std::vector<float> mono;
  for (int first_link = -1;;) {
    float** pcm = nullptr;
    int link = 0;
    const long got = ov_read_float(&vorbis.file, &pcm, static_cast<int>(kReadBlockFrames), &link);
    if (got == 0) break;
    if (got == OV_HOLE) continue;  // a gap in the pages: libvorbisfile resumes after it, as libsndfile does
    if (got < 0) throw Error(fmt::format("{}: corrupt audio data (Ogg Vorbis error {})", what, got));
    if (first_link < 0) first_link = link;
    if (link != first_link) break;  // the next link of a chained stream begins
    append_mono(mono, got, info.channels, limits.max_seconds * info.samplerate, limits, what,
                [&](int64_t i, int c) { return pcm[c][i]; });
  }
  if (mono.empty()) throw Error(fmt::format("{}: the file holds no audio samples", what));
  require_finite(mono, what, "");
  rate = info.samplerate;
  return mono;
}

std::vector<float> read_sndfile_mono(std::span<const uint8_t> bytes, const AudioLimits& limits, std::string_view what,
                                     int& rate) {
  MemoryStream stream{bytes};
  SF_VIRTUAL_IO io{stream_length, stream_seek, stream_read, stream_write, stream_tell};
  SF_INFO info{};
  SndfileHandle file(sf_open_virtual(&io, SFM_READ, &info, &stream));
  if (!file) throw Error(fmt::format("{}: cannot decode the audio ({})", what, sf_strerror(nullptr)));
  check_header(info, limits, what);
  rate = info.samplerate;
  return read_mono(file.get(), info, limits, what);
}

}  // namespace

std::string_view sniff_audio_format(std::span<const uint8_t> bytes) {
  if (starts_with(bytes, "RIFF") && starts_with(bytes, "WAVE", 8)) return "wav";
  if (starts_with(bytes, "fLaC")) return "flac";
  if (starts_with(bytes, "OggS")) return ogg_codec(bytes);
  if (is_mp3_frame_header(bytes.subspan(after_id3_tags(bytes)))) return "mp3";
  return "";
}

std::vector<float> decode_audio(std::span<const uint8_t> bytes, std::string_view format_hint, const AudioLimits& limits,
                                std::string_view what) {
  if (bytes.empty()) throw Error(fmt::format("{}: empty audio data", what));
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes)
    throw Error(fmt::format("{}: {} bytes of audio, more than the {} allowed", what, bytes.size(), limits.max_bytes));
  const std::string_view format = sniff_audio_format(bytes);
  check_format_hint(format_hint, format, what);
  // Ogg Vorbis does not go through libsndfile: when libsndfile 1.2.0 fails to open a malformed Vorbis stream it
  // leaks libvorbis' vorbis_info (~5.8 KB an upload; libsndfile#922), which a hostile client could repeat.
  int rate = 0;
  std::vector<float> mono =
      format == "ogg" ? read_vorbis_mono(bytes, limits, what, rate) : read_sndfile_mono(bytes, limits, what, rate);
  std::vector<float> resampled = resample_hq(std::move(mono), rate, kAudioSampleRate, what);
  require_finite(resampled, what, " after resampling");
  return resampled;
}

}  // namespace qs::media
