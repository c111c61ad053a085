#include "server/openai_responses.h"

#include <fmt/format.h>

#include <set>
#include <string_view>
#include <utility>

#include "server/request_id.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// The field, or nullptr when absent or null (clients send null for "not set").
const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  return "null";
}

std::string string_field(const json& object, const char* name, const std::string& where, const std::string& param) {
  const json* v = field(object, name);
  if (!v || !v->is_string()) bad(param, fmt::format("{}.{} must be a string", where, name));
  return v->get<std::string>();
}

// ---- input items -> chat messages ------------------------------------------------------------------------------

// A message's content parts as chat parts: input_text / output_text -> text, input_image -> image_url.
json chat_parts(const json& parts, const std::string& where) {
  json out = json::array();
  for (size_t k = 0; k < parts.size(); ++k) {
    const json& part = parts[k];
    const std::string at = fmt::format("{}.content[{}]", where, k);
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "";
    if (kind == "input_text" || kind == "output_text" || kind == "text") {
      out.push_back({{"type", "text"}, {"text", string_field(part, "text", at, "input")}});
    } else if (kind == "refusal") {
      out.push_back({{"type", "text"}, {"text", string_field(part, "refusal", at, "input")}});
    } else if (kind == "input_image") {
      const json* url = field(part, "image_url");
      if (!url || !url->is_string())
        bad("input", fmt::format("{}.image_url must be a data:image/...;base64 URL (file_id is not supported)", at));
      json image_url = {{"url", *url}};
      if (const json* detail = field(part, "detail")) image_url["detail"] = *detail;
      out.push_back({{"type", "image_url"}, {"image_url", std::move(image_url)}});
    } else {
      bad("input", fmt::format("{}.type \"{}\" is not supported; expected input_text, output_text or input_image", at,
                               kind));
    }
  }
  return out;
}

// The text of a content list whose parts are all text (assistant messages, function outputs).
std::string joined_text(const json& parts, const std::string& where) {
  std::string text;
  for (const json& p : chat_parts(parts, where)) {
    if (p["type"] != "text") bad("input", fmt::format("{}: only text parts are read here", where));
    text += p["text"].get<std::string>();
  }
  return text;
}

// Builds the chat messages of a conversation, item by item.
class ConversationBuilder {
 public:
  void add(const json& item, const std::string& where) {
    if (!item.is_object()) bad("input", fmt::format("{} must be an object, got {}", where, type_name(item)));
    const json* type = field(item, "type");
    std::string kind = type && type->is_string() ? type->get<std::string>() : "";
    if (!type && field(item, "role")) kind = "message";  // EasyInputMessage: {role, content}
    if (kind == "message") message(item, where);
    else if (kind == "function_call") function_call(item, where);
    else if (kind == "function_call_output") function_call_output(item, where);
    else if (kind == "reasoning") reasoning(item, where);
    else
      bad("input", fmt::format("{}.type \"{}\" is not supported; expected message, function_call, "
                               "function_call_output or reasoning",
                               where, kind));
  }

  // The next item is not assistant-side: the assistant message in progress is complete.
  void end_assistant_run() { open_assistant_ = false; }

  // Calls without text: content null, as a chat client writes such a message.
  json messages() && {
    for (json& m : messages_)
      if (m["role"] == "assistant" && m.contains("tool_calls") && m["content"] == "") m["content"] = nullptr;
    return std::move(messages_);
  }

 private:
  void message(const json& item, const std::string& where) {
    const std::string role = string_field(item, "role", where, "input");
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      bad("input", fmt::format("{}.role \"{}\" is not supported; expected user, system, developer or assistant",
                               where, role));
    const json* content = field(item, "content");
    json chat_content = "";
    if (content && content->is_string()) chat_content = *content;
    else if (content && content->is_array()) chat_content = role == "assistant" ? json(joined_text(*content, where))
                                                                              : chat_parts(*content, where);
    else if (content) bad("input", fmt::format("{}.content must be a string or an array of parts", where));
    if (role == "assistant") {
      json& m = assistant_turn(/*for_reasoning=*/false);
      m["content"] = m["content"].is_string() ? json(m["content"].get<std::string>() + chat_content.get<std::string>())
                                              : chat_content;
      return;
    }
    messages_.push_back({{"role", role}, {"content", std::move(chat_content)}});
  }

  void function_call(const json& item, const std::string& where) {
    const std::string call_id = string_field(item, "call_id", where, "input");
    const std::string name = string_field(item, "name", where, "input");
    const std::string arguments = string_field(item, "arguments", where, "input");
    if (!arguments.empty() && !json::accept(arguments))
      bad("input", fmt::format("{}.arguments is not a JSON string", where));
    json& m = assistant_turn(false);
    if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
    m["tool_calls"].push_back(
        {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    call_ids_.insert(call_id);
  }

  void function_call_output(const json& item, const std::string& where) {
    const std::string call_id = string_field(item, "call_id", where, "input");
    if (!call_ids_.count(call_id))
      bad("input", fmt::format("{}.call_id \"{}\" matches no function_call in the conversation", where, call_id));
    const json* output = field(item, "output");
    std::string text;
    if (output && output->is_string()) text = output->get<std::string>();
    else if (output && output->is_array()) text = joined_text(*output, where);
    else bad("input", fmt::format("{}.output must be a string or an array of input_text parts", where));
    messages_.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
  }

  void reasoning(const json& item, const std::string& where) {
    std::string text;
    const json* content = field(item, "content");
    const json* summary = field(item, "summary");
    for (const json* list : {content, summary}) {
      if (!list || !text.empty()) continue;
      if (!list->is_array()) bad("input", fmt::format("{}: content and summary must be arrays", where));
      for (const json& part : *list) {
        if (!part.is_object()) bad("input", fmt::format("{}: a reasoning part must be an object", where));
        text += string_field(part, "text", where, "input");
      }
    }
    json& m = assistant_turn(true);
    m["reasoning_content"] = m.value("reasoning_content", std::string()) + text;
  }

  // The assistant message the next assistant-side item joins: the last message when it is one this run of items
  // opened (reasoning starts a new one once content or calls were written), else a new one.
  json& assistant_turn(bool for_reasoning) {
    const bool reuse = !messages_.empty() && messages_.back()["role"] == "assistant" && open_assistant_ &&
                       !(for_reasoning && (messages_.back().contains("tool_calls") ||
                                           !messages_.back()["content"].get<std::string>().empty()));
    if (!reuse) messages_.push_back({{"role", "assistant"}, {"content", ""}});
    open_assistant_ = true;
    return messages_.back();
  }

  json messages_ = json::array();
  std::set<std::string> call_ids_;
  bool open_assistant_ = false;
};

json chat_messages(const json* instructions, const json& conversation) {
  ConversationBuilder builder;
  json system = json::array();
  for (size_t i = 0; i < conversation.size(); ++i) {
    const json& item = conversation[i];
    const json* role = item.is_object() ? field(item, "role") : nullptr;
    const json* type = item.is_object() ? field(item, "type") : nullptr;
    const bool assistant_side = (role && *role == "assistant") ||
                                (type && (*type == "function_call" || *type == "reasoning"));
    if (!assistant_side) builder.end_assistant_run();
    builder.add(item, fmt::format("input[{}]", i));
  }
  json messages = std::move(builder).messages();
  if (instructions) {
    if (!instructions->is_string()) bad("instructions", "instructions must be a string");
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", *instructions}});
  }
  if (messages.empty()) bad("input", "input must not be empty");
  return messages;
}

// ---- tools, tool_choice, text.format ---------------------------------------------------------------------------

json chat_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", fmt::format("tools must be an array, got {}", type_name(tools)));
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const json* type = t.is_object() ? field(t, "type") : nullptr;
    if (!type || *type != "function")
      bad("tools", fmt::format("tools[{}].type must be \"function\" (the only tool type this server runs)", i));
    json function = {{"name", string_field(t, "name", fmt::format("tools[{}]", i), "tools")}};
    if (const json* d = field(t, "description")) function["description"] = *d;
    if (const json* p = field(t, "parameters")) function["parameters"] = *p;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

json chat_tool_choice(const json& choice) {
  if (choice.is_string()) return choice;
  const json* type = choice.is_object() ? field(choice, "type") : nullptr;
  if (!type || *type != "function")
    bad("tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}");
  return {{"type", "function"}, {"function", {{"name", string_field(choice, "name", "tool_choice", "tool_choice")}}}};
}

json chat_response_format(const json& text) {
  if (!text.is_object()) bad("text", "text must be an object {\"format\": {...}}");
  const json* format = field(text, "format");
  if (!format) return nullptr;
  const json* type = format->is_object() ? field(*format, "type") : nullptr;
  if (!type || !type->is_string())
    bad("text.format", "text.format must be an object with a type (text, json_object or json_schema)");
  if (*type == "text" || *type == "json_object") return {{"type", *type}};
  if (*type != "json_schema")
    bad("text.format", fmt::format("text.format.type {} is not one of text, json_object, json_schema", type->dump()));
  json schema = {{"name", string_field(*format, "name", "text.format", "text.format")}};
  if (const json* s = field(*format, "schema")) schema["schema"] = *s;
  if (const json* s = field(*format, "strict")) schema["strict"] = *s;
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

// Fields that mean something this server does not do: refused rather than silently ignored.
void refuse_unsupported(const json& body) {
  if (const json* v = field(body, "background"); v && *v != false)
    bad("background", "background responses are not supported by this server");
  if (field(body, "conversation")) bad("conversation", "conversation is not supported; use previous_response_id");
  if (field(body, "prompt")) bad("prompt", "prompt templates are not supported by this server");
}

ojson echoed_fields(const json& body) {
  auto given = [&](const char* name, ojson fallback) {
    const json* v = field(body, name);
    return v ? ojson(*v) : fallback;
  };
  ojson echo;
  echo["instructions"] = given("instructions", nullptr);
  echo["tools"] = given("tools", ojson::array());
  echo["tool_choice"] = given("tool_choice", "auto");
  echo["parallel_tool_calls"] = given("parallel_tool_calls", true);
  echo["temperature"] = given("temperature", nullptr);
  echo["top_p"] = given("top_p", nullptr);
  echo["max_output_tokens"] = given("max_output_tokens", nullptr);
  echo["previous_response_id"] = given("previous_response_id", nullptr);
  echo["reasoning"] = given("reasoning", ojson{{"effort", nullptr}, {"summary", nullptr}});
  echo["text"] = given("text", ojson{{"format", {{"type", "text"}}}});
  echo["truncation"] = "disabled";
  echo["metadata"] = given("metadata", ojson::object());
  echo["user"] = given("user", nullptr);
  echo["store"] = given("store", true);
  echo["background"] = false;
  return echo;
}

void check_metadata(const json& body) {
  const json* m = field(body, "metadata");
  if (!m) return;
  if (!m->is_object()) bad("metadata", "metadata must be an object of string values");
  if (m->size() > 16) bad("metadata", "metadata holds at most 16 keys");
  for (const auto& [key, value] : m->items())
    if (!value.is_string()) bad("metadata", fmt::format("metadata.{} must be a string", key));
}

// The conversation as input items: a string input is one user message.
json input_items(const json& body) {
  const json* input = field(body, "input");
  if (!input) bad("input", "input is required");
  if (input->is_string()) return json::array({{{"type", "message"}, {"role", "user"}, {"content", *input}}});
  if (!input->is_array()) bad("input", fmt::format("input must be a string or an array of items, got {}",
                                                   type_name(*input)));
  return *input;
}

}  // namespace

json responses_chat_body(const json& body, const json& conversation) {
  refuse_unsupported(body);
  json chat = json::object();
  chat["messages"] = chat_messages(field(body, "instructions"), conversation);
  if (const json* v = field(body, "tools")) chat["tools"] = chat_tools(*v);
  if (const json* v = field(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*v);
  if (const json* v = field(body, "text")) {
    json format = chat_response_format(*v);
    if (!format.is_null()) chat["response_format"] = std::move(format);
  }
  if (const json* v = field(body, "reasoning")) {
    if (!v->is_object()) bad("reasoning", "reasoning must be an object {\"effort\": ...}");
    if (const json* effort = field(*v, "effort")) chat["reasoning_effort"] = *effort;
  }
  if (const json* v = field(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
  for (const char* name : {"model", "temperature", "top_p", "parallel_tool_calls", "stream", "top_k", "seed",
                           "repetition_penalty", "logit_bias", "mm_processor_kwargs"})
    if (const json* v = field(body, name)) chat[name] = *v;
  return chat;
}

namespace {

// Chat Completions names and the Responses fields they came from, longest first (a name may contain another).
// "messages" is renamed in the parameter only: a message's index counts chat messages, not input items, so the text
// keeps saying "messages[i]".
constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
    {"response_format.json_schema", "text.format"},
    {"max_completion_tokens", "max_output_tokens"},
    {"response_format", "text.format"},
    {"reasoning_effort", "reasoning.effort"},
    {"max_tokens", "max_output_tokens"},
};

std::string renamed(std::string text) {
  for (const auto& [chat, responses] : kRenamed)
    for (size_t at = text.find(chat); at != std::string::npos; at = text.find(chat, at + responses.size()))
      text.replace(at, chat.size(), responses);
  return text;
}

}  // namespace

ApiError responses_error(const ApiError& e) {
  const std::string param = e.param() == "messages" ? "input" : renamed(e.param());
  return ApiError(e.status(), renamed(e.what()), param, e.type(), e.code());
}

ResponsesRequest parse_responses_request(const json& body, const ServedModel& model, ResponseStore* store) {
  ResponsesRequest r;
  if (const json* v = field(body, "store")) {
    if (!v->is_boolean()) bad("store", "store must be a boolean");
    r.store = v->get<bool>() && store;
  }
  check_metadata(body);
  if (const json* v = field(body, "user"); v && !v->is_string()) bad("user", "user must be a string");
  if (const json* v = field(body, "previous_response_id")) {
    if (!v->is_string()) bad("previous_response_id", "previous_response_id must be a string");
    std::optional<StoredResponse> previous = store ? store->get(v->get<std::string>()) : std::nullopt;
    if (!previous)
      throw ApiError(404, fmt::format("Previous response with id '{}' not found.", v->get<std::string>()),
                     "previous_response_id", "invalid_request_error", "previous_response_not_found");
    r.conversation = std::move(previous->conversation);
  }
  for (const json& item : input_items(body)) r.conversation.push_back(item);
  try {
    r.chat = parse_chat_request(responses_chat_body(body, r.conversation), model);
  } catch (const ApiError& e) {
    throw responses_error(e);
  }
  r.echo = echoed_fields(body);
  return r;
}

ojson retrieve_response(ResponseStore& store, const std::string& id) {
  std::optional<StoredResponse> stored = store.get(id);
  if (!stored) throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "response_id");
  return std::move(stored->response);
}

ojson delete_response(ResponseStore& store, const std::string& id) {
  if (!store.erase(id)) throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "response_id");
  return {{"id", id}, {"object", "response.deleted"}, {"deleted", true}};
}

ojson cancel_response(ResponseStore& store, const std::string& id) {
  std::optional<StoredResponse> stored = store.get(id);
  if (!stored) throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "response_id");
  throw ApiError(400, fmt::format("Cannot cancel response '{}': only background responses can be cancelled, and "
                                  "it has already finished ({}).",
                                  id, stored->response.value("status", std::string("completed"))),
                 "response_id");
}

std::string new_response_id() {
  return random_id("resp_");
}

}  // namespace qs
