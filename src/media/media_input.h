#pragma once
// Media as requests carry it, before decoding: an image or audio clip's bytes, the format the request declared
// and where in the request it came from (so every later error can name the part). The OpenAI forms:
//   {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
//   {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qs::media {

enum class MediaKind { Image, Audio };
std::string_view media_kind_name(MediaKind kind);  // "image" | "audio"

struct MediaInput {
  MediaKind kind = MediaKind::Image;
  std::string bytes;            // the encoded file, as sent
  std::string declared_format;  // "png", "jpeg", "wav", ...: from the data URL's MIME type or input_audio.format
  std::string where;            // e.g. "messages[1].content[2]"
  // An image's soft-token budget (Gemma4Processor's max_soft_tokens: 70, 140, 280, 560 or 1120) as the request
  // chose it; 0: the processor's own.
  int image_soft_tokens = 0;
};

// The format a MIME type declares for `kind`: "image/png" -> "png", "audio/x-wav" -> "wav" (case-insensitive,
// parameters after ';' ignored); nullopt when the type is not <kind>/<token>.
std::optional<std::string> declared_media_format(std::string_view mime_type, MediaKind kind);

// ASCII lower case (MIME types, URL schemes and host names).
std::string ascii_lower(std::string_view s);

// RFC 4648 base64 (standard alphabet; padding optional; no whitespace). Throws qs::Error naming `where` at the
// first character that is not base64, or when the decoded size would pass max_bytes (checked before decoding).
std::string decode_base64(std::string_view text, int64_t max_bytes, std::string_view where);

// A `data:<type>/<subtype>[;params];base64,<data>` URL: the subtype as the declared format ("png", "jpeg", "wav"
// for audio/wav or audio/x-wav, ...) and the decoded bytes. Throws qs::Error naming `where` for any other URL,
// a type other than `expected_type` ("image" or "audio"), or data that is not base64.
MediaInput parse_data_url(std::string_view url, MediaKind expected, int64_t max_bytes, std::string where);

}  // namespace qs::media
