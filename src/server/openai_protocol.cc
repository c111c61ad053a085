#include "server/openai_protocol.h"

#include <fmt/format.h>

#include "server/request_fields.h"
#include "server/request_id.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type, std::string code)
    : Error(message), status_(status), param_(std::move(param)), type_(std::move(type)), code_(std::move(code)) {}

ojson error_body(std::string_view message, std::string_view type, std::string_view param, std::string_view code) {
  ojson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  // vLLM's codes are the HTTP status as a number (404), OpenAI's are words (invalid_api_key): each as its client
  // expects it.
  const bool numeric = !code.empty() && code.find_first_not_of("0123456789") == std::string_view::npos;
  e["code"] = code.empty() ? ojson(nullptr) : numeric ? ojson(std::stoi(std::string(code))) : ojson(code);
  ojson body;
  body["error"] = std::move(e);
  return body;
}

ojson error_body(const ApiError& error) { return error_body(error.what(), error.type(), error.param(), error.code()); }

std::string dump_json(const ojson& value) { return value.dump(-1, ' ', false, ojson::error_handler_t::replace); }

json parse_json_body(std::string_view body) {
  json v = request_fields::parse_request_json(body, "", "the request body");
  if (!v.is_object())
    throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", request_fields::describe(v)));
  return v;
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  ojson u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  return u;
}

std::string sse_frame(const ojson& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string new_request_id(ApiKind kind) {
  return random_id(kind == ApiKind::Chat ? "chatcmpl-" : "cmpl-");
}

}  // namespace qs
