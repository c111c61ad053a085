#pragma once
// Anthropic's Messages API, the response side: one assembler reads the engine's events of a Messages request
// (parsed by ModelOutputSplitter into reasoning, content and whole tool calls, as the chat path reads them) and
// builds the message's content blocks from those structured deltas, never from another API's rendering. The
// streamed events and the non-streamed body come from the same assembler, so they hold the same blocks:
//
//   thinking {thinking, signature}   the thought channel (thinking on); closed by a signature_delta
//   text {text}                      content; whitespace alone between or around calls is no block
//   tool_use {id: "toolu_...", name, input}   each call, its input sent whole as one input_json_delta
//
// Stream: message_start, ping, then per block content_block_start / content_block_delta... / content_block_stop
// (one block open at a time), message_delta {stop_reason, stop_sequence, usage.output_tokens}, message_stop; no
// [DONE]. stop_reason: tool_use when a call was made, max_tokens at the length limit, stop_sequence (naming it) when
// a stop sequence ended the text, else end_turn. A generation that fails mid-stream ends with an `error` event.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_protocol.h"
#include "text/tool_calls.h"

namespace qs {

class MessageAssembler {
 public:
  // `streaming`: event() returns the server-sent events; otherwise it only accumulates.
  MessageAssembler(const OutputParsing& parsing, std::string id, std::string model, int64_t input_tokens,
                   bool streaming);

  std::string start();                       // message_start and a ping
  std::string event(const EngineEvent& e);   // what this event completes; on the last event, the end of the message

  bool finished() const { return finished_; }
  // Once finished: the whole message, or, when generation failed or was aborted, the error to answer with.
  nlohmann::ordered_json message() const;
  const std::optional<ApiError>& failure() const { return failure_; }

 private:
  enum class Block { None, Thinking, Text };
  std::string push(const OutputDelta& delta);
  std::string open(Block kind, nlohmann::ordered_json start_block);
  std::string close_block();
  std::string add_text(const std::string& text);
  std::string add_tool_use(const ParsedToolCall& call);
  std::string finish(const EngineEvent& e);
  std::string sse(const char* type, nlohmann::ordered_json data) const;
  std::string stop_reason(const EngineEvent& e) const;

  OutputParsing parsing_;
  std::optional<ModelOutputSplitter> splitter_;  // when parsing is enabled
  std::string id_, model_;
  int64_t input_tokens_, output_tokens_ = 0;
  bool streaming_;
  nlohmann::ordered_json content_ = nlohmann::ordered_json::array();  // the blocks so far
  Block open_ = Block::None;
  std::string held_space_;  // whitespace-only text not yet in a block: dropped next to a call
  bool made_calls_ = false, finished_ = false;
  std::string stop_reason_;
  std::optional<std::string> stop_sequence_;
  std::optional<ApiError> failure_;
};

// "msg_<24 hex>"
std::string new_message_id();

// A thinking block's signature: a digest of its text. Gemma 4's thoughts are not encrypted or verified; clients
// only need a stable, non-empty value to send back with the block.
std::string thinking_signature(const std::string& thinking);

}  // namespace qs
