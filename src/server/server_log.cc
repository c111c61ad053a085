#include "server/server_log.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>

#include "util/error.h"

namespace qs {
namespace {

// RFC 3339 UTC with milliseconds, the timestamp form collectors parse without configuration.
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(ms));
}

}  // namespace

LogFormat parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::Text;
  if (name == "json") return LogFormat::Json;
  throw Error(fmt::format("--log-format '{}': expected text or json", name));
}

std::string ServerLog::line(std::string_view event, std::string_view message, nlohmann::ordered_json fields,
                            std::string_view level) const {
  if (format_ == LogFormat::Text) return fmt::format("serve: {}", message);
  nlohmann::ordered_json j;
  j["time"] = utc_now();
  j["level"] = level;
  j["event"] = event;
  j["message"] = message;
  if (fields.is_object())
    for (auto& [key, value] : fields.items()) j[key] = std::move(value);
  // Never throws on odd bytes (a path or an error text): replaced, so the line stays one valid JSON object.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void ServerLog::write(std::string_view event, std::string_view message, nlohmann::ordered_json fields,
                      std::string_view level) const {
  const std::string text = line(event, message, std::move(fields), level) + "\n";
  // One fwrite per line: lines from different threads never interleave.
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

}  // namespace qs
