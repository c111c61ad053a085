#pragma once
// The server's log on stderr: one line per event (startup steps, each generation request, failures). `text` is the
// human line `serve: ...`; `json` writes the same event as one JSON object per line for log collectors (Loki,
// Fluent Bit, Vector, Cloud Logging), with the values as fields rather than inside a sentence:
//   {"time":"2026-12-01T16:00:00.123Z","level":"info","event":"request","message":"<the text line>",...fields}
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qs {

enum class LogFormat { Text, Json };
// "text" or "json"; throws naming --log-format otherwise.
LogFormat parse_log_format(std::string_view name);

class ServerLog {
 public:
  explicit ServerLog(LogFormat format = LogFormat::Text, std::FILE* out = stderr) : format_(format), out_(out) {}
  LogFormat format() const { return format_; }

  // Writes one line: `message` is the text line's body; `fields` (an object) the values a collector indexes.
  void write(std::string_view event, std::string_view message, nlohmann::ordered_json fields = nullptr,
             std::string_view level = "info") const;
  // The line write() prints, without the newline (for tests).
  std::string line(std::string_view event, std::string_view message, nlohmann::ordered_json fields,
                   std::string_view level) const;

 private:
  LogFormat format_;
  std::FILE* out_;
};

}  // namespace qs
