#include "server/json_response.h"

#include "server/anthropic_messages_request.h"

namespace qs {

HttpResponse json_response(int status, const nlohmann::ordered_json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(const ApiError& e, bool anthropic) {
  HttpResponse r = json_response(e.status(), anthropic ? anthropic_error_body(e) : error_body(e));
  if (e.status() == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace qs
