#include "media/media_input.h"

#include <fmt/format.h>

#include <array>
#include <cctype>

#include "util/error.h"

namespace qs::media {

std::string_view media_kind_name(MediaKind kind) { return kind == MediaKind::Image ? "image" : "audio"; }

namespace {

constexpr std::array<int8_t, 256> base64_values() {
  std::array<int8_t, 256> v{};
  v.fill(-1);
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < alphabet.size(); ++i) v[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
  return v;
}

bool is_alnum_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '+')) return false;
  return true;
}

}  // namespace

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::string> declared_media_format(std::string_view mime_type, MediaKind kind) {
  std::string mime = ascii_lower(mime_type.substr(0, mime_type.find(';')));
  while (!mime.empty() && mime.back() == ' ') mime.pop_back();
  const size_t slash = mime.find('/');
  if (slash == std::string::npos || mime.substr(0, slash) != media_kind_name(kind) || !is_alnum_token(mime.substr(slash + 1)))
    return std::nullopt;
  std::string format = mime.substr(slash + 1);
  if (format.starts_with("x-")) format.erase(0, 2);  // audio/x-wav, image/x-png
  return format;
}

std::string decode_base64(std::string_view text, int64_t max_bytes, std::string_view where) {
  static constexpr std::array<int8_t, 256> values = base64_values();
  size_t end = text.size();
  for (int pad = 0; pad < 2 && end > 0 && text[end - 1] == '='; ++pad) --end;
  const int64_t decoded_size = static_cast<int64_t>(end / 4 * 3 + (end % 4 > 1 ? end % 4 - 1 : 0));
  if (decoded_size > max_bytes)
    throw Error(fmt::format("{}: the media is {} bytes; this server accepts at most {}", where, decoded_size, max_bytes));
  std::string out;
  out.reserve(static_cast<size_t>(decoded_size));
  uint32_t bits = 0;
  int held = 0;
  for (size_t i = 0; i < end; ++i) {
    int8_t v = values[static_cast<uint8_t>(text[i])];
    if (v < 0)
      throw Error(fmt::format("{}: byte {} of the base64 data ({:#04x}) is not in the base64 alphabet", where, i,
                              static_cast<uint8_t>(text[i])));
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xff));
    }
  }
  if (end % 4 == 1)
    throw Error(fmt::format("{}: the base64 data has {} characters, which no byte count encodes", where, end));
  return out;
}

MediaInput parse_data_url(std::string_view url, MediaKind expected, int64_t max_bytes, std::string where) {
  constexpr std::string_view scheme = "data:";
  const std::string kind(media_kind_name(expected));
  if (url.size() < scheme.size() || ascii_lower(url.substr(0, scheme.size())) != scheme)
    throw Error(fmt::format("{}: expected a data URL (data:{}/<format>;base64,...)", where, kind));
  url.remove_prefix(scheme.size());
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos)
    throw Error(fmt::format("{}: the data URL has no ',' before its data", where));
  std::string_view header = url.substr(0, comma);
  const size_t semicolon = header.find(';');
  const std::string_view mime = header.substr(0, semicolon);
  const bool base64 = semicolon != std::string_view::npos && ascii_lower(header.substr(header.rfind(';') + 1)) == "base64";
  if (!base64) throw Error(fmt::format("{}: the data URL must be base64-encoded (';base64,')", where));
  std::optional<std::string> format = declared_media_format(mime, expected);
  if (!format)
    throw Error(fmt::format("{}: the data URL's type is '{}'; expected {}/<format>", where, ascii_lower(mime), kind));
  MediaInput input;
  input.kind = expected;
  input.declared_format = std::move(*format);
  input.bytes = decode_base64(url.substr(comma + 1), max_bytes, where);
  input.where = std::move(where);
  return input;
}

}  // namespace qs::media
