#pragma once
// One generation request in flight (Exchange) and its sequences: the state its preparing worker, the engine's
// sinks and its connection share (generation_source.h, in_flight_requests.h).
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/audio_transcriptions.h"
#include "server/openai_protocol.h"
#include "server/responses_output.h"

namespace qs {

using ServerClock = std::chrono::steady_clock;

inline double seconds(ServerClock::duration d) { return std::chrono::duration<double>(d).count(); }

// Which API a generation request came through: Responses requests and transcriptions run as the chat requests they
// convert to.
enum class Endpoint { Chat, Completion, Responses, Messages, Transcription };

// One sequence (choice) of an HTTP request.
struct Sequence {
  uint64_t engine_id = 0;
  bool submitted = false, finished = false;
  std::optional<ServerClock::time_point> first_token, last_token;
  ServerClock::time_point end;
  int64_t generated = 0;
  std::string finish_reason;
};

// One generation request: prepared on a PrepareQueue worker (parsed, templated, tokenized, media decoded, then
// submitted), after which the engine's sinks (engine thread) queue events here and wake the connection, whose
// GenerationSource reads them on the I/O thread.
struct Exchange {
  std::string id, path;
  std::string client_request_id;  // X-Request-Id as sent: echoed in the response headers and the log line
  bool anthropic = false;  // POST /v1/messages: Anthropic's response and error shapes
  std::string content_type;  // the request's Content-Type header (a transcription's multipart boundary)
  std::optional<TranscriptionFormat> transcription;  // POST /v1/audio/transcriptions: its answer's format
  ServerClock::time_point arrival;
  int64_t created = 0;  // unix seconds, as responses report it
  int64_t prompt_tokens = 0;

  std::mutex mutex;
  std::deque<std::pair<size_t, EngineEvent>> events;
  std::vector<Sequence> sequences;
  size_t unfinished = 0;
  bool client_gone = false;  // sinks answer false: the engine cancels
  bool discarded = false;    // refused (preparation or submit): nothing is recorded
  std::function<void()> wake;  // the connection's: called (worker or engine thread) after a change
  std::optional<CompletionRequest> prepared;  // once every choice is submitted
  std::unique_ptr<ResponsesWriter> responses;  // POST /v1/responses: its answer, set with `prepared`
  std::optional<ApiError> refusal;            // or why the request was refused
};

}  // namespace qs
