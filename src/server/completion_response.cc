// The answers of Chat Completions and Completions (openai_protocol.h): a chat choice's message (tool calls and
// reasoning read back from the model's output), the whole non-streaming response, and the server-sent events of a
// streaming one (SseStream).
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <utility>

#include "server/openai_protocol.h"
#include "server/request_id.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::string new_tool_call_id() {
  return random_id("call_");
}

ojson tool_call_json(const ParsedToolCall& call) {
  ojson function;
  function["name"] = call.name;
  function["arguments"] = call.arguments.dump(-1, ' ', false, json::error_handler_t::replace);
  ojson c;
  c["id"] = new_tool_call_id();
  c["type"] = "function";
  c["function"] = std::move(function);
  return c;
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

ModelOutputSplitter splitter_for(const OutputParsing& parsing) {
  return ModelOutputSplitter(parsing.starts_in_thought, parsing.tool_calls);
}

}  // namespace

ojson chat_message(const std::string& text, const OutputParsing& parsing, std::string& finish_reason) {
  ojson message;
  message["role"] = "assistant";
  if (!parsing.enabled) {
    message["content"] = text;
    return message;
  }
  ModelOutputSplitter splitter = splitter_for(parsing);
  OutputDelta all = splitter.push(text);
  all.append(splitter.finish());
  // Only calls: content is null (whitespace around the calls is not an answer).
  message["content"] = all.calls.empty() || !all_space(all.content) ? ojson(all.content) : ojson(nullptr);
  if (parsing.reasoning) message["reasoning_content"] = all.reasoning;
  if (!all.calls.empty()) {
    ojson calls = ojson::array();
    for (const ParsedToolCall& call : all.calls) calls.push_back(tool_call_json(call));
    message["tool_calls"] = std::move(calls);
    if (finish_reason != "error" && finish_reason != "abort") finish_reason = "tool_calls";
  }
  return message;
}

ojson completion_response(const CompletionRequest& request, const ServedModel& model, std::string_view id,
                          int64_t created, std::span<const ChoiceResult> choices) {
  const bool chat = request.kind == ApiKind::Chat;
  ojson r;
  r["id"] = id;
  r["object"] = chat ? "chat.completion" : "text_completion";
  r["created"] = created;
  r["model"] = answered_model(request, model);
  ojson list = ojson::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    completion_tokens += c.completion_tokens;
    ojson choice;
    choice["index"] = i;
    ojson logprobs = nullptr;
    int64_t offset = 0;
    if (request.logprobs.enabled && request.echo)
      logprobs = echo_completion_logprobs(request.choices[i].prompt, c.prompt_logprobs, c.tokens, request.logprobs,
                                          *model.tokenizer, offset);
    else if (request.logprobs.enabled)
      logprobs = chat ? chat_logprobs(c.tokens, request.logprobs, *model.tokenizer)
                      : completion_logprobs(c.tokens, request.logprobs, *model.tokenizer, offset);
    std::string finish_reason = c.finish_reason;
    if (chat) {
      choice["message"] = chat_message(c.text, request.parsing, finish_reason);
    } else {
      choice["text"] = request.echo ? request.echo_texts[i] + c.text : c.text;
    }
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = finish_reason;
    list.push_back(std::move(choice));
  }
  r["choices"] = std::move(list);
  r["usage"] = usage_json(request.prompt_tokens, completion_tokens);
  return r;
}

SseStream::SseStream(const CompletionRequest& request, const ServedModel& model, std::string id, int64_t created)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      model_(model),
      model_name_(answered_model(request, model)),
      id_(std::move(id)),
      created_(created),
      prompt_tokens_(request.prompt_tokens),
      completion_tokens_(request.choices.size(), 0),
      text_offset_(request.choices.size(), 0),
      parsing_(request.parsing),
      calls_sent_(request.choices.size(), 0) {
  if (parsing_.enabled)
    for (size_t i = 0; i < request.choices.size(); ++i) splitters_.push_back(splitter_for(parsing_));
  if (request.echo)
    for (size_t i = 0; i < request.choices.size(); ++i)
      unechoed_.push_back(EchoedPrompt{request.echo_texts[i], request.choices[i].prompt});
}

// The delta of a parsed chunk: content, reasoning_content, and each completed call whole (index, id, type, name
// and its complete arguments in one delta: a call's arguments are only known to be well-formed once it closes).
ojson SseStream::chat_delta(size_t choice, const OutputDelta& delta) {
  ojson out = ojson::object();
  if (!delta.content.empty()) out["content"] = delta.content;
  if (!delta.reasoning.empty() && parsing_.reasoning) out["reasoning_content"] = delta.reasoning;
  if (!delta.calls.empty()) {
    ojson calls = ojson::array();
    for (const ParsedToolCall& call : delta.calls) {
      ojson c = tool_call_json(call);
      c["index"] = calls_sent_[choice]++;
      calls.push_back(std::move(c));
    }
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

ojson SseStream::chunk(size_t choice, ojson delta_or_text, const ojson& logprobs,
                       const std::string& finish_reason) const {
  const bool chat = kind_ == ApiKind::Chat;
  ojson c;
  c["id"] = id_;
  c["object"] = chat ? "chat.completion.chunk" : "text_completion";
  c["created"] = created_;
  c["model"] = model_name_;
  ojson ch;
  ch["index"] = choice;
  ch[chat ? "delta" : "text"] = std::move(delta_or_text);
  ch["logprobs"] = logprobs;
  ch["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  c["choices"] = ojson::array({std::move(ch)});
  if (continuous_usage_) c["usage"] = usage_json(prompt_tokens_, completion_tokens_[choice]);
  else if (include_usage_) c["usage"] = nullptr;
  return c;
}

std::string SseStream::start() {
  if (kind_ != ApiKind::Chat) return "";
  std::string out;
  for (size_t i = 0; i < completion_tokens_.size(); ++i) {
    ojson delta;
    delta["role"] = "assistant";
    delta["content"] = "";
    out += sse_frame(chunk(i, std::move(delta), nullptr, ""));
  }
  return out;
}

std::string SseStream::event(size_t choice, const EngineEvent& event) {
  const bool chat = kind_ == ApiKind::Chat;
  std::string out;
  completion_tokens_[choice] += static_cast<int64_t>(event.tokens.size());
  if (event.finished && event.completion_tokens > 0) completion_tokens_[choice] = event.completion_tokens;
  // Echo (as vLLM streams it): a choice's first chunk carries its prompt before its first text, and with logprobs
  // the prompt's tokens before the first generated ones.
  std::optional<EchoedPrompt> echo;
  if (choice < unechoed_.size() && unechoed_[choice]) echo = std::exchange(unechoed_[choice], std::nullopt);
  const bool with_logprobs = logprobs_.enabled && (!event.tokens.empty() || echo);
  ojson payload;
  bool has_text = !event.text.empty();
  if (echo) {
    payload = echo->text + event.text;
    has_text = true;
  } else if (!chat) {
    payload = event.text;
  } else if (parsing_.enabled) {
    OutputDelta delta = splitters_[choice].push(event.text);
    if (event.finished) delta.append(splitters_[choice].finish());
    payload = chat_delta(choice, delta);
    has_text = !payload.empty();
  } else {
    payload["content"] = event.text;
  }
  if (has_text || with_logprobs) {
    ojson logprobs = nullptr;
    if (with_logprobs && echo)
      logprobs = echo_completion_logprobs(echo->prompt, event.prompt_logprobs, event.tokens, logprobs_,
                                          *model_.tokenizer, text_offset_[choice]);
    else if (with_logprobs)
      logprobs = chat ? chat_logprobs(event.tokens, logprobs_, *model_.tokenizer)
                      : completion_logprobs(event.tokens, logprobs_, *model_.tokenizer, text_offset_[choice]);
    out += sse_frame(chunk(choice, std::move(payload), logprobs, ""));
  }
  if (event.finished) {
    if (event.finish_reason == "error") {
      out += sse_frame(error_body(event.error.empty() ? "generation failed" : event.error, "server_error"));
    } else {
      std::string reason = event.finish_reason;
      if (calls_sent_[choice] > 0 && reason != "abort") reason = "tool_calls";
      out += sse_frame(chunk(choice, chat ? ojson::object() : ojson(""), nullptr, reason));
    }
  }
  return out;
}

int64_t SseStream::completion_tokens() const {
  int64_t total = 0;
  for (int64_t n : completion_tokens_) total += n;
  return total;
}

std::string SseStream::finish() {
  std::string out;
  if (include_usage_) {
    ojson c;
    c["id"] = id_;
    c["object"] = kind_ == ApiKind::Chat ? "chat.completion.chunk" : "text_completion";
    c["created"] = created_;
    c["model"] = model_name_;
    c["choices"] = ojson::array();
    c["usage"] = usage_json(prompt_tokens_, completion_tokens());
    out += sse_frame(c);
  }
  out += kSseDone;
  return out;
}

}  // namespace qs
