#pragma once
// The JSON answers of the API routes: a body with its status, and an ApiError in OpenAI's or Anthropic's error
// shape (a 429 also says when to retry).
#include <nlohmann/json.hpp>

#include "server/http_transport.h"
#include "server/openai_protocol.h"

namespace qs {

HttpResponse json_response(int status, const nlohmann::ordered_json& body);
HttpResponse error_response(const ApiError& e, bool anthropic = false);

}  // namespace qs
