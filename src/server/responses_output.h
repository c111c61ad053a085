#pragma once
// The output side of POST /v1/responses: one accumulator reads the engine's events of a request (the generated text
// split by ModelOutputSplitter into reasoning, content and whole tool calls, as on chat) and builds the response's
// output items, minting every id once. It hands back the stream's events as it goes; the non-streamed body, the
// last streamed event (response.completed / response.incomplete / response.failed) and the stored response are all
// its response(), so they agree item for item.
//
// Items, in the order the model writes them: reasoning {summary: [], content: [reasoning_text]} (thinking on),
// message {role: assistant, content: [output_text {annotations: []}]}, function_call {id "fc_...", call_id
// "call_...", name, arguments: JSON string}. Content that is only whitespace around calls opens no message (on chat
// it is content null). Events: response.created, response.in_progress; per reasoning or message item
// output_item.added, content_part.added, reasoning_text.delta / output_text.delta ..., reasoning_text.done /
// output_text.done, content_part.done, output_item.done; per call output_item.added,
// function_call_arguments.delta (the whole arguments: they are known well-formed only once the call closes),
// function_call_arguments.done, output_item.done; then response.completed, or response.incomplete
// (incomplete_details.reason "max_output_tokens") on a length stop, or response.failed. Each carries
// sequence_number, and output_index / content_index / item_id where OpenAI's do.
//
// usage: input_tokens (the prompt), output_tokens, total_tokens, input_tokens_details.cached_tokens (0: not
// reported by the engine), output_tokens_details.reasoning_tokens (tokens of the events that added only reasoning).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_responses.h"
#include "text/tool_calls.h"

namespace qs {

class ResponseAccumulator {
 public:
  ResponseAccumulator(const ResponsesRequest& request, std::string model_name, std::string id, int64_t created);

  // The stream's events so far, each a JSON object with its "type" and "sequence_number".
  std::vector<nlohmann::ordered_json> start();
  std::vector<nlohmann::ordered_json> event(const EngineEvent& event);  // the last one has finished set

  const nlohmann::ordered_json& response() const { return response_; }
  const std::string& status() const { return response_["status"].get_ref<const std::string&>(); }
  std::string error_message() const;  // when status() is "failed"

 private:
  enum class Open { None, Reasoning, Message };
  using Events = std::vector<nlohmann::ordered_json>;

  nlohmann::ordered_json next_event(const char* type);
  void apply(const OutputDelta& delta, int64_t tokens, Events& out);
  void append_text(Open kind, const std::string& text, Events& out);
  void open_item(Open kind, Events& out);
  void close_item(const char* status, Events& out);
  void add_call(const ParsedToolCall& call, Events& out);
  void finish(const EngineEvent& last, Events& out);
  nlohmann::ordered_json usage() const;

  nlohmann::ordered_json response_;  // items are response_["output"]
  OutputParsing parsing_;
  std::optional<ModelOutputSplitter> splitter_;
  Open open_ = Open::None;
  std::string held_space_;  // content that is only whitespace so far: a message only if something else follows
  bool made_calls_ = false;
  int64_t sequence_ = 0;
  int64_t input_tokens_ = 0, output_tokens_ = 0, reasoning_tokens_ = 0;
};

// A Responses request's answer, as the server's connection sends it: server-sent events as the engine's events
// come (stream: true), or the response object once the last one has come. When the request asked for it, the
// finished response is put in the store (failed ones too, as OpenAI keeps them).
class ResponsesWriter {
 public:
  ResponsesWriter(const ResponsesRequest& request, std::string model_name, std::string id, int64_t created,
                  ResponseStore* store);
  bool stream() const { return stream_; }
  std::string start();                        // the first events (stream), else ""
  std::string event(const EngineEvent& event);  // its events (stream), else ""
  // After the last event, not streaming: the HTTP status (200, or 500 when generation failed) and body.
  int status() const;
  std::string body() const;

 private:
  bool stream_;
  nlohmann::json conversation_;  // continued by the output items when stored
  ResponseAccumulator accumulator_;
  ResponseStore* store_;
};

// "event: TYPE\ndata: JSON\n\n" for each event.
std::string responses_sse(const std::vector<nlohmann::ordered_json>& events);

// What the store keeps of a finished response: it, and the conversation continued by its output items.
StoredResponse stored_response(nlohmann::json conversation, const nlohmann::ordered_json& response);

}  // namespace qs
