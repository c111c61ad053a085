#include "server/anthropic_messages_response.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "server/anthropic_messages_request.h"
#include "server/request_id.h"

namespace qs {

using ojson = nlohmann::ordered_json;

namespace {


bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

}  // namespace

std::string new_message_id() { return random_id("msg_"); }

std::string thinking_signature(const std::string& thinking) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits
  for (unsigned char c : thinking) hash = (hash ^ c) * 0x100000001b3ull;
  return fmt::format("fnv1a64:{:016x}", hash);
}

MessageAssembler::MessageAssembler(const OutputParsing& parsing, std::string id, std::string model,
                                   int64_t input_tokens, bool streaming)
    : parsing_(parsing), id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens),
      streaming_(streaming) {
  if (parsing_.enabled) splitter_.emplace(parsing_.starts_in_thought, parsing_.tool_calls);
}

// "event: TYPE\ndata: {"type": TYPE, ...fields}\n\n" when streaming; nothing otherwise.
std::string MessageAssembler::sse(const char* type, ojson fields) const {
  if (!streaming_) return "";
  ojson data;
  data["type"] = type;
  for (auto& [key, value] : fields.items()) data[key] = std::move(value);
  return fmt::format("event: {}\ndata: {}\n\n", type, dump_json(data));
}

std::string MessageAssembler::start() {
  ojson message;
  message["id"] = id_;
  message["type"] = "message";
  message["role"] = "assistant";
  message["model"] = model_;
  message["content"] = ojson::array();
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  message["usage"] = {{"input_tokens", input_tokens_}, {"output_tokens", 0}};
  return sse("message_start", {{"message", std::move(message)}}) + sse("ping", ojson::object());
}

std::string MessageAssembler::event(const EngineEvent& e) {
  if (finished_) return "";
  output_tokens_ += static_cast<int64_t>(e.tokens.size());
  if (e.finished && e.completion_tokens > 0) output_tokens_ = e.completion_tokens;
  OutputDelta delta;
  if (splitter_) {
    delta = splitter_->push(e.text);
    if (e.finished) delta.append(splitter_->finish());
  } else {
    delta.content = e.text;
  }
  std::string out = push(delta);
  if (e.finished) out += finish(e);
  return out;
}

// Within one delta the order is reasoning, content, calls: the order the model writes them in (an event is a token
// or a few, so a delta rarely holds more than one).
std::string MessageAssembler::push(const OutputDelta& delta) {
  std::string out;
  if (!delta.reasoning.empty() && parsing_.reasoning) {
    if (open_ != Block::Thinking) {
      out += close_block();
      out += open(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    content_.back()["thinking"].get_ref<std::string&>() += delta.reasoning;  // in place: a long answer stays linear
    out += sse("content_block_delta", {{"index", content_.size() - 1},
                                       {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
  }
  if (!delta.content.empty()) out += add_text(delta.content);
  for (const ParsedToolCall& call : delta.calls) out += add_tool_use(call);
  return out;
}

std::string MessageAssembler::open(Block kind, ojson start_block) {
  content_.push_back(start_block);
  open_ = kind;
  return sse("content_block_start", {{"index", content_.size() - 1}, {"content_block", std::move(start_block)}});
}

// A thinking block ends with its signature (Anthropic's clients send it back with the block).
std::string MessageAssembler::close_block() {
  if (open_ == Block::None) return "";
  std::string out;
  const size_t index = content_.size() - 1;
  if (open_ == Block::Thinking) {
    const std::string signature = thinking_signature(content_.back()["thinking"].get<std::string>());
    content_.back()["signature"] = signature;
    out += sse("content_block_delta", {{"index", index}, {"delta", {{"type", "signature_delta"}, {"signature", signature}}}});
  }
  open_ = Block::None;
  return out + sse("content_block_stop", {{"index", index}});
}

// Whitespace is held until text follows it (then it is the text's) or a call does (then it is dropped, as the chat
// path's content is null when only whitespace surrounds calls).
std::string MessageAssembler::add_text(const std::string& text) {
  std::string piece = text;
  std::string out;
  if (open_ != Block::Text) {
    held_space_ += text;
    if (all_space(held_space_)) return "";
    piece = std::move(held_space_);
    held_space_.clear();
    out += close_block();
    out += open(Block::Text, {{"type", "text"}, {"text", ""}});
  }
  content_.back()["text"].get_ref<std::string&>() += piece;
  return out + sse("content_block_delta", {{"index", content_.size() - 1},
                                           {"delta", {{"type", "text_delta"}, {"text", piece}}}});
}

// A call arrives whole (its arguments are only known to be well-formed once it closes): one block, its input in one
// input_json_delta.
std::string MessageAssembler::add_tool_use(const ParsedToolCall& call) {
  held_space_.clear();
  made_calls_ = true;
  std::string out = close_block();
  const std::string tool_id = random_id("toolu_");
  const size_t index = content_.size();
  content_.push_back({{"type", "tool_use"}, {"id", tool_id}, {"name", call.name}, {"input", call.arguments}});
  out += sse("content_block_start", {{"index", index},
                                     {"content_block", {{"type", "tool_use"}, {"id", tool_id}, {"name", call.name},
                                                        {"input", ojson::object()}}}});
  out += sse("content_block_delta",
             {{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", dump_json(call.arguments)}}}});
  return out + sse("content_block_stop", {{"index", index}});
}

std::string MessageAssembler::stop_reason(const EngineEvent& e) const {
  if (made_calls_) return "tool_use";
  if (e.finish_reason == "length") return "max_tokens";
  if (!e.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

std::string MessageAssembler::finish(const EngineEvent& e) {
  std::string out;
  if (content_.empty() && !held_space_.empty()) {  // a whitespace answer is still the answer
    out += open(Block::Text, {{"type", "text"}, {"text", ""}});
    out += add_text(std::exchange(held_space_, ""));
  }
  out += close_block();
  finished_ = true;
  if (e.finish_reason == "error" || e.finish_reason == "abort") {
    failure_ = e.finish_reason == "error"
                   ? ApiError(500, e.error.empty() ? "generation failed" : e.error, "", "server_error")
                   : ApiError(503, "the request was aborted: the server is shutting down", "", "server_error");
    return out + sse("error", {{"error", anthropic_error_body(*failure_)["error"]}});
  }
  stop_reason_ = stop_reason(e);
  if (stop_reason_ == "stop_sequence") stop_sequence_ = e.stop_string;
  ojson delta = {{"stop_reason", stop_reason_},
                 {"stop_sequence", stop_sequence_ ? ojson(*stop_sequence_) : ojson(nullptr)}};
  out += sse("message_delta", {{"delta", std::move(delta)}, {"usage", {{"output_tokens", output_tokens_}}}});
  return out + sse("message_stop", ojson::object());
}

ojson MessageAssembler::message() const {
  ojson m;
  m["id"] = id_;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model_;
  m["content"] = content_;
  m["stop_reason"] = stop_reason_.empty() ? ojson(nullptr) : ojson(stop_reason_);
  m["stop_sequence"] = stop_sequence_ ? ojson(*stop_sequence_) : ojson(nullptr);
  m["usage"] = {{"input_tokens", input_tokens_}, {"output_tokens", output_tokens_}};
  return m;
}

}  // namespace qs
