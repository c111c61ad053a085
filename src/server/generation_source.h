#pragma once
// The response of one generation request, read by its connection on the I/O thread as the engine's events arrive:
// server-sent events as they come (streaming), or the whole completion once every choice has finished, in the
// shape of the API the request came through (Chat Completions, Completions, Responses or Anthropic's Messages).
// Its end (done, or the connection gone) logs the request.
#include <memory>

#include "server/exchange.h"
#include "server/http_transport.h"
#include "server/in_flight_requests.h"
#include "server/openai_protocol.h"

namespace qs {

std::shared_ptr<ResponseSource> generation_source(InFlightRequests& requests, const ServedModel& served,
                                                  std::shared_ptr<Exchange> ex);

}  // namespace qs
