#pragma once
// Reading the fields of an OpenAI request body (Chat Completions, Completions, tokenize): each reader checks the
// JSON type and range and throws ApiError 400 naming the parameter and what it got instead.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_protocol.h"

namespace qs::request_fields {

[[noreturn]] void bad(const std::string& param, const std::string& message);

// A value as an error message names it: "a string (\"abc\")", "an integer (3)", "an array"...
std::string describe(const nlohmann::json& v);

// The field, or nullptr when it is absent or null (OpenAI clients send null for "not set").
const nlohmann::json* find(const nlohmann::json& body, const char* name);

double as_number(const nlohmann::json& v, const std::string& name);
int64_t as_integer(const nlohmann::json& v, const std::string& name);
int64_t as_integer_in(const nlohmann::json& v, const std::string& name, int64_t lo, int64_t hi);
bool as_bool(const nlohmann::json& v, const std::string& name);
std::string as_string(const nlohmann::json& v, const std::string& name);
int32_t token_in_vocab(const nlohmann::json& v, const std::string& name, const ServedModel& model);
std::vector<int32_t> token_list(const nlohmann::json& v, const std::string& name, const ServedModel& model);

// `text` as JSON, else ApiError 400 (param `param`) saying what `what` is not. Refuses JSON nested deeper than
// kMaxRequestJsonDepth while parsing.
nlohmann::json parse_request_json(std::string_view text, const std::string& param, const std::string& what);

}  // namespace qs::request_fields
