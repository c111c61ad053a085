#pragma once
// X-Request-Id: the correlation id benchmark clients (vllm bench serve, GuideLLM, AIPerf) and proxies send. serve
// echoes it in the response headers and writes it in the request's log line, so it must be short printable ASCII
// (it goes into a header and a log line as sent); anything else is a 400.
#include <string>
#include <string_view>

namespace qs {

inline constexpr size_t kMaxRequestIdBytes = 256;

bool valid_request_id(std::string_view id);
// Throws ApiError 400 (param "X-Request-Id") for an id valid_request_id refuses; an empty one is none.
void check_request_id(std::string_view id);

// An id the server mints: `prefix` then 24 random hex digits (96 bits: unique without coordination). Every API's
// ids (chatcmpl-, call_, resp_, msg_, toolu_, ...) are made here.
std::string random_id(std::string_view prefix);

}  // namespace qs
