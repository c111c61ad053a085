#include "server/responses_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "server/request_id.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {


bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

ojson text_part(bool reasoning, const std::string& text) {
  if (reasoning) return {{"type", "reasoning_text"}, {"text", text}};
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}

}  // namespace

ResponseAccumulator::ResponseAccumulator(const ResponsesRequest& request, std::string model_name, std::string id,
                                         int64_t created)
    : parsing_(request.chat.parsing), input_tokens_(request.chat.prompt_tokens) {
  if (parsing_.enabled) splitter_.emplace(parsing_.starts_in_thought, parsing_.tool_calls);
  response_["id"] = std::move(id);
  response_["object"] = "response";
  response_["created_at"] = created;
  response_["status"] = "in_progress";
  response_["error"] = nullptr;
  response_["incomplete_details"] = nullptr;
  response_["model"] = std::move(model_name);
  response_["output"] = ojson::array();
  for (const auto& [key, value] : request.echo.items()) response_[key] = value;
  response_["usage"] = nullptr;
}

ojson ResponseAccumulator::next_event(const char* type) {
  ojson e;
  e["type"] = type;
  e["sequence_number"] = sequence_++;
  return e;
}

std::vector<ojson> ResponseAccumulator::start() {
  Events out;
  for (const char* type : {"response.created", "response.in_progress"}) {
    ojson e = next_event(type);
    e["response"] = response_;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<ojson> ResponseAccumulator::event(const EngineEvent& event) {
  Events out;
  const auto tokens = static_cast<int64_t>(event.tokens.size());
  output_tokens_ += tokens;
  OutputDelta delta;
  if (splitter_) {
    delta = splitter_->push(event.text);
    if (event.finished) delta.append(splitter_->finish());
  } else {
    delta.content = event.text;
  }
  apply(delta, tokens, out);
  if (event.finished) finish(event, out);
  return out;
}

// Reasoning, then content, then calls: an event is a token or a few, so their order inside one is the model's.
// Thoughts are dropped when thinking was not asked for, as on chat.
void ResponseAccumulator::apply(const OutputDelta& delta, int64_t tokens, Events& out) {
  if (parsing_.reasoning && !delta.reasoning.empty()) {
    if (delta.content.empty() && delta.calls.empty()) reasoning_tokens_ += tokens;
    append_text(Open::Reasoning, delta.reasoning, out);
  }
  if (!delta.content.empty()) {
    if (open_ != Open::Message && all_space(held_space_ + delta.content)) held_space_ += delta.content;
    else append_text(Open::Message, std::exchange(held_space_, "") + delta.content, out);
  }
  for (const ParsedToolCall& call : delta.calls) add_call(call, out);
}

void ResponseAccumulator::append_text(Open kind, const std::string& text, Events& out) {
  if (open_ != kind) {
    close_item("completed", out);
    open_item(kind, out);
  }
  const size_t index = response_["output"].size() - 1;
  ojson& item = response_["output"][index];
  ojson& part = item["content"][0];
  part["text"].get_ref<std::string&>() += text;  // in place: a long answer stays linear
  const bool reasoning = kind == Open::Reasoning;
  ojson e = next_event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta");
  e["item_id"] = item["id"];
  e["output_index"] = index;
  e["content_index"] = 0;
  e["delta"] = text;
  if (!reasoning) e["logprobs"] = ojson::array();
  out.push_back(std::move(e));
}

void ResponseAccumulator::open_item(Open kind, Events& out) {
  const bool reasoning = kind == Open::Reasoning;
  ojson item;
  item["id"] = random_id(reasoning ? "rs_" : "msg_");
  item["type"] = reasoning ? "reasoning" : "message";
  item["status"] = "in_progress";
  if (reasoning) item["summary"] = ojson::array();
  else item["role"] = "assistant";
  item["content"] = ojson::array();
  const size_t index = response_["output"].size();
  ojson added = next_event("response.output_item.added");
  added["output_index"] = index;
  added["item"] = item;
  out.push_back(std::move(added));
  item["content"].push_back(text_part(reasoning, ""));
  ojson part = next_event("response.content_part.added");
  part["item_id"] = item["id"];
  part["output_index"] = index;
  part["content_index"] = 0;
  part["part"] = item["content"][0];
  out.push_back(std::move(part));
  response_["output"].push_back(std::move(item));
  open_ = kind;
}

void ResponseAccumulator::close_item(const char* status, Events& out) {
  if (open_ == Open::None) return;
  const bool reasoning = open_ == Open::Reasoning;
  open_ = Open::None;
  const size_t index = response_["output"].size() - 1;
  ojson& item = response_["output"][index];
  item["status"] = status;
  const ojson& part = item["content"][0];
  ojson done = next_event(reasoning ? "response.reasoning_text.done" : "response.output_text.done");
  done["item_id"] = item["id"];
  done["output_index"] = index;
  done["content_index"] = 0;
  done["text"] = part["text"];
  if (!reasoning) done["logprobs"] = ojson::array();
  out.push_back(std::move(done));
  ojson part_done = next_event("response.content_part.done");
  part_done["item_id"] = item["id"];
  part_done["output_index"] = index;
  part_done["content_index"] = 0;
  part_done["part"] = part;
  out.push_back(std::move(part_done));
  ojson item_done = next_event("response.output_item.done");
  item_done["output_index"] = index;
  item_done["item"] = item;
  out.push_back(std::move(item_done));
}

void ResponseAccumulator::add_call(const ParsedToolCall& call, Events& out) {
  close_item("completed", out);
  held_space_.clear();  // whitespace around calls is not an answer
  made_calls_ = true;
  const std::string arguments = call.arguments.dump(-1, ' ', false, json::error_handler_t::replace);
  ojson item;
  item["id"] = random_id("fc_");
  item["type"] = "function_call";
  item["status"] = "in_progress";
  item["call_id"] = random_id("call_");
  item["name"] = call.name;
  item["arguments"] = "";
  const size_t index = response_["output"].size();
  ojson added = next_event("response.output_item.added");
  added["output_index"] = index;
  added["item"] = item;
  out.push_back(std::move(added));
  ojson delta = next_event("response.function_call_arguments.delta");
  delta["item_id"] = item["id"];
  delta["output_index"] = index;
  delta["delta"] = arguments;
  out.push_back(std::move(delta));
  ojson done = next_event("response.function_call_arguments.done");
  done["item_id"] = item["id"];
  done["output_index"] = index;
  done["name"] = call.name;
  done["arguments"] = arguments;
  out.push_back(std::move(done));
  item["arguments"] = arguments;
  item["status"] = "completed";
  ojson item_done = next_event("response.output_item.done");
  item_done["output_index"] = index;
  item_done["item"] = item;
  out.push_back(std::move(item_done));
  response_["output"].push_back(std::move(item));
}

// The last event: what is open closes, the status follows the finish reason, and the final event carries the
// whole response. An abort (the server shutting down past its grace) is a failure the client did not cause.
void ResponseAccumulator::finish(const EngineEvent& last, Events& out) {
  if (last.completion_tokens > 0) output_tokens_ = last.completion_tokens;
  if (!held_space_.empty() && !made_calls_) append_text(Open::Message, std::exchange(held_space_, ""), out);
  const std::string& reason = last.finish_reason;
  const bool length = reason == "length", failed = reason == "error" || reason == "abort";
  close_item(length ? "incomplete" : "completed", out);
  response_["status"] = length ? "incomplete" : failed ? "failed" : "completed";
  if (length) response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (failed) {
    const std::string message = reason == "abort" ? "generation was aborted" : last.error;
    response_["error"] = {{"code", "server_error"}, {"message", message.empty() ? "generation failed" : message}};
  }
  response_["usage"] = usage();
  ojson e = next_event(length ? "response.incomplete" : failed ? "response.failed" : "response.completed");
  e["response"] = response_;
  out.push_back(std::move(e));
}

std::string ResponseAccumulator::error_message() const {
  const ojson& e = response_["error"];
  return e.is_object() ? e["message"].get<std::string>() : "";
}

ojson ResponseAccumulator::usage() const {
  ojson u;
  u["input_tokens"] = input_tokens_;
  u["input_tokens_details"] = {{"cached_tokens", 0}, {"cache_write_tokens", 0}};
  u["output_tokens"] = output_tokens_;
  u["output_tokens_details"] = {{"reasoning_tokens", reasoning_tokens_}};
  u["total_tokens"] = input_tokens_ + output_tokens_;
  return u;
}

ResponsesWriter::ResponsesWriter(const ResponsesRequest& request, std::string model_name, std::string id,
                                 int64_t created, ResponseStore* store)
    : stream_(request.chat.stream),
      conversation_(request.store ? request.conversation : json::array()),
      accumulator_(request, std::move(model_name), std::move(id), created),
      store_(request.store ? store : nullptr) {}

std::string ResponsesWriter::start() {
  std::vector<ojson> events = accumulator_.start();
  return stream_ ? responses_sse(events) : "";
}

std::string ResponsesWriter::event(const EngineEvent& event) {
  std::vector<ojson> events = accumulator_.event(event);
  if (event.finished && store_)
    store_->put(accumulator_.response()["id"].get<std::string>(), stored_response(conversation_, accumulator_.response()));
  return stream_ ? responses_sse(events) : "";
}

int ResponsesWriter::status() const { return accumulator_.status() == "failed" ? 500 : 200; }

std::string ResponsesWriter::body() const {
  if (status() == 200) return dump_json(accumulator_.response());
  return dump_json(error_body(accumulator_.error_message(), "server_error"));
}

std::string responses_sse(const std::vector<ojson>& events) {
  std::string out;
  for (const ojson& e : events)
    out += fmt::format("event: {}\ndata: {}\n\n", e["type"].get<std::string>(), dump_json(e));
  return out;
}

StoredResponse stored_response(json conversation, const ojson& response) {
  StoredResponse s;
  s.response = response;
  s.conversation = std::move(conversation);
  for (const ojson& item : response["output"]) s.conversation.push_back(json::parse(dump_json(item)));
  return s;
}

}  // namespace qs
