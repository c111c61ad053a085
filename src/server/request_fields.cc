#include "server/request_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "util/json_parse.h"

namespace qs::request_fields {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return fmt::format("a boolean ({})", v.get<bool>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return fmt::format("an integer ({})", v.dump());
    case json::value_t::number_float: return fmt::format("a number ({})", v.dump());
    case json::value_t::string: {
      std::string s = v.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return fmt::format("a string ({})", json(s).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

const json* find(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double as_number(const json& v, const std::string& name) {
  if (!v.is_number()) bad(name, fmt::format("{} must be a number, got {}", name, describe(v)));
  return v.get<double>();
}

int64_t as_integer(const json& v, const std::string& name) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(name, fmt::format("{} is too large: {}", name, v.dump()));
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  bad(name, fmt::format("{} must be an integer, got {}", name, describe(v)));
}

int64_t as_integer_in(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  int64_t x = as_integer(v, name);
  if (x < lo || x > hi) bad(name, fmt::format("{} must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

bool as_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("{} must be a boolean, got {}", name, describe(v)));
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("{} must be a string, got {}", name, describe(v)));
  return v.get<std::string>();
}

int32_t token_in_vocab(const json& v, const std::string& name, const ServedModel& model) {
  int64_t id = as_integer(v, name);
  if (id < 0 || id >= model.vocab_size)
    bad(name, fmt::format("{}: token id {} is outside the vocabulary of {} tokens", name, id, model.vocab_size));
  return static_cast<int32_t>(id);
}

std::vector<int32_t> token_list(const json& v, const std::string& name, const ServedModel& model) {
  if (!v.is_array()) bad(name, fmt::format("{} must be an array of token ids, got {}", name, describe(v)));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& x : v) ids.push_back(token_in_vocab(x, name, model));
  return ids;
}

// Requests nest a few levels (a tool's parameter schema perhaps a dozen). Deeper JSON is refused while parsing, before
// the recursive code that reads it (nlohmann's copy and dump, the chat template's argument and schema formatting,
// the schema compiler) could overflow the stack: 400 KB of nested tool parameters did (fuzz/openai_request_fuzz
// on a crafted input; the fuzzer's 16 KB inputs nest too little to reach it).
json parse_request_json(std::string_view text, const std::string& param, const std::string& what) {
  json::parser_callback_t limit_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxRequestJsonDepth)
      bad(param, fmt::format("{} nests more than {} levels deep", what, kMaxRequestJsonDepth));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit_depth);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number beyond double (1e999)
    bad(param, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

}  // namespace qs::request_fields
