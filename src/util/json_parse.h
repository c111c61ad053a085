#pragma once
// JSON that qatserve reads from files (configs, indexes, the CLI's --tools/--json-schema/--messages files), parsed
// with nlohmann::json and its nesting bounded: objects and arrays nested deeper than `max_depth` are refused while
// parsing, before code that recurses over the value (nlohmann's dump in an error message, the chat template's
// formatting, the schema compiler) could overflow the stack on it (fuzz/RECORD.md: found in config.json and index
// files). A config nests a few levels; what a request could carry (a tool's parameter schema perhaps a dozen) gets
// the server's bound for request bodies.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "util/error.h"
#include "util/file.h"

namespace qs {

inline constexpr int kMaxFileJsonDepth = 64;
inline constexpr int kMaxRequestJsonDepth = 128;

// `text` as JSON, else a qs::Error "<label>: not valid JSON (...)" or "<label>: JSON nests more than N levels deep".
template <class Json = nlohmann::json>
Json parse_json(std::string_view text, std::string_view label, int max_depth = kMaxFileJsonDepth) {
  typename Json::parser_callback_t limit_depth = [&](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) && depth >= max_depth)
      throw Error(fmt::format("{}: JSON nests more than {} levels deep", label, max_depth));
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), limit_depth);
  } catch (const typename Json::exception& e) {  // parse_error, or out_of_range for a number beyond double (1e999)
    throw Error(fmt::format("{}: not valid JSON ({})", label, e.what()));
  }
}

// The file at `path` as JSON: read_file's error, or parse_json's, naming the path.
template <class Json = nlohmann::json>
Json read_json_file(const std::filesystem::path& path, int max_depth = kMaxFileJsonDepth) {
  return parse_json<Json>(read_file(path), path.string(), max_depth);
}

}  // namespace qs
