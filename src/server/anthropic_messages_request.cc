#include "server/anthropic_messages_request.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Anthropic names a field by its path, indices included: "messages.1.content.0.tool_use_id".
[[noreturn]] void bad(const std::string& path, const std::string& message) {
  throw ApiError(400, fmt::format("{}: {}", path, message), path);
}

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

// The field, or nullptr when it is absent or null.
const json* find(const json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const std::string& required_string(const json& object, const char* name, const std::string& where) {
  const json* v = find(object, name);
  if (!v) bad(where + "." + name, "Field required");
  if (!v->is_string()) bad(where + "." + name, fmt::format("expected a string, got {}", type_name(*v)));
  return v->get_ref<const std::string&>();
}

void expect_object(const json& v, const std::string& where) {
  if (!v.is_object()) bad(where, fmt::format("expected an object, got {}", type_name(v)));
}

std::string block_type(const json& block, const std::string& where) {
  expect_object(block, where);
  return required_string(block, "type", where);
}

json text_part(const std::string& text) { return {{"type", "text"}, {"text", text}}; }

// {type: "text", text}: its text.
const std::string& text_of(const json& block, const std::string& where) { return required_string(block, "text", where); }

// {type: "image", source: {type: "base64", media_type, data} | {type: "url", url}}: a chat image_url part, which
// the chat path decodes (a data URL) or fetches (an http(s) URL, when the operator allows its host).
json image_part(const json& block, const std::string& where) {
  const std::string source_path = where + ".source";
  const json* source = find(block, "source");
  if (!source) bad(source_path, "Field required");
  expect_object(*source, source_path);
  const std::string& kind = required_string(*source, "type", source_path);
  std::string url;
  if (kind == "base64") {
    url = fmt::format("data:{};base64,{}", required_string(*source, "media_type", source_path),
                      required_string(*source, "data", source_path));
  } else if (kind == "url") {
    url = required_string(*source, "url", source_path);
  } else {
    bad(source_path + ".type", fmt::format("\"{}\" is not supported; expected base64 or url", kind));
  }
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

// A system prompt or a tool_result's content: a string, or text blocks joined by newlines.
std::string text_blocks(const json& content, const std::string& where, bool images_named) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, fmt::format("expected a string or an array of text blocks, got {}", type_name(content)));
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string path = fmt::format("{}.{}", where, k);
    const std::string type = block_type(content[k], path);
    if (type == "image" && images_named)
      bad(path + ".type", "image blocks inside a tool_result are not supported by this server; send the image in a "
                          "user message's content");
    if (type != "text") bad(path + ".type", fmt::format("\"{}\" blocks are not allowed here; expected text", type));
    if (k > 0) text += "\n";
    text += text_of(content[k], path);
  }
  return text;
}

// Converts the conversation, checking that each tool_result answers a tool_use of the assistant message before it.
class ConversationConverter {
 public:
  explicit ConversationConverter(json& chat_messages) : out_(chat_messages) {}

  void add(const json& message, size_t i) {
    const std::string where = fmt::format("messages.{}", i);
    expect_object(message, where);
    const std::string& role = required_string(message, "role", where);
    if (role != "user" && role != "assistant")
      bad(where + ".role", fmt::format("\"{}\" is not supported; expected user or assistant", role));
    const json* content = find(message, "content");
    if (!content) bad(where + ".content", "Field required");
    if (!content->is_string() && !content->is_array())
      bad(where + ".content", fmt::format("expected a string or an array of content blocks, got {}", type_name(*content)));
    std::map<std::string, std::string> calls;  // this message's tool_use ids and names
    if (role == "user") add_user(*content, where + ".content");
    else calls = add_assistant(*content, where + ".content");
    previous_calls_ = std::move(calls);
  }

 private:
  void add_user(const json& content, const std::string& where) {
    if (content.is_string()) {
      out_.push_back({{"role", "user"}, {"content", content}});
      return;
    }
    json parts = json::array();
    for (size_t k = 0; k < content.size(); ++k) {
      const std::string path = fmt::format("{}.{}", where, k);
      const std::string type = block_type(content[k], path);
      if (type == "text") parts.push_back(text_part(text_of(content[k], path)));
      else if (type == "image") parts.push_back(image_part(content[k], path));
      else if (type == "tool_result") out_.push_back(tool_message(content[k], path));
      else unsupported(type, path, "text, image or tool_result");
    }
    // A turn of tool results only has no user message after them.
    if (!parts.empty() || content.empty()) out_.push_back({{"role", "user"}, {"content", parts}});
  }

  // The tool message answering a tool_use of the previous assistant message.
  json tool_message(const json& block, const std::string& where) {
    const std::string& id = required_string(block, "tool_use_id", where);
    auto call = previous_calls_.find(id);
    if (call == previous_calls_.end())
      bad(where + ".tool_use_id", fmt::format("unexpected tool_use_id \"{}\": each tool_result block must answer a "
                                              "tool_use block of the previous (assistant) message", id));
    std::string text;
    if (const json* content = find(block, "content")) text = text_blocks(*content, where + ".content", true);
    if (const json* is_error = find(block, "is_error")) {
      if (!is_error->is_boolean()) bad(where + ".is_error", fmt::format("expected a boolean, got {}", type_name(*is_error)));
      if (is_error->get<bool>()) text = "Error: " + text;
    }
    return {{"role", "tool"}, {"tool_call_id", id}, {"name", call->second}, {"content", text}};
  }

  std::map<std::string, std::string> add_assistant(const json& content, const std::string& where) {
    std::map<std::string, std::string> calls;
    if (content.is_string()) {
      out_.push_back({{"role", "assistant"}, {"content", content}});
      return calls;
    }
    json message = {{"role", "assistant"}};
    json parts = json::array(), tool_calls = json::array();
    std::string reasoning;
    for (size_t k = 0; k < content.size(); ++k) {
      const std::string path = fmt::format("{}.{}", where, k);
      const std::string type = block_type(content[k], path);
      if (type == "text") {
        parts.push_back(text_part(text_of(content[k], path)));
      } else if (type == "thinking") {
        reasoning += required_string(content[k], "thinking", path);
      } else if (type == "redacted_thinking") {
        continue;  // another model's encrypted thoughts: nothing this one can read
      } else if (type == "tool_use") {
        const std::string& id = required_string(content[k], "id", path);
        const std::string& name = required_string(content[k], "name", path);
        const json* input = find(content[k], "input");
        if (!input) bad(path + ".input", "Field required");
        expect_object(*input, path + ".input");
        calls[id] = name;
        tool_calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *input}}}});
      } else {
        unsupported(type, path, "text, thinking, redacted_thinking or tool_use");
      }
    }
    message["content"] = parts.empty() && !tool_calls.empty() ? json(nullptr) : parts;
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
    out_.push_back(std::move(message));
    return calls;
  }

  [[noreturn]] static void unsupported(const std::string& type, const std::string& path, const char* expected) {
    bad(path + ".type", fmt::format("\"{}\" blocks are not supported in this message; expected {}", type, expected));
  }

  json& out_;
  std::map<std::string, std::string> previous_calls_;  // id -> name
};

json convert_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", fmt::format("expected an array, got {}", type_name(tools)));
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = fmt::format("tools.{}", i);
    expect_object(tools[i], where);
    if (const json* type = find(tools[i], "type"); type && *type != "custom")
      bad(where + ".type", fmt::format("{} is not supported: this server runs custom tools only (name, description, "
                                       "input_schema)", type->dump()));
    json function = {{"name", required_string(tools[i], "name", where)}};
    if (const json* d = find(tools[i], "description")) {
      if (!d->is_string()) bad(where + ".description", fmt::format("expected a string, got {}", type_name(*d)));
      function["description"] = *d;
    }
    const json* schema = find(tools[i], "input_schema");
    if (!schema) bad(where + ".input_schema", "Field required");
    expect_object(*schema, where + ".input_schema");
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// tool_choice: its chat tool_choice, and parallel_tool_calls false when disable_parallel_tool_use is set.
void convert_tool_choice(const json& choice, json& chat) {
  expect_object(choice, "tool_choice");
  const std::string& type = required_string(choice, "type", "tool_choice");
  if (type == "auto") chat["tool_choice"] = "auto";
  else if (type == "any") chat["tool_choice"] = "required";
  else if (type == "none") chat["tool_choice"] = "none";
  else if (type == "tool")
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", required_string(choice, "name", "tool_choice")}}}};
  else bad("tool_choice.type", fmt::format("\"{}\" is not one of auto, any, tool, none", type));
  if (const json* p = find(choice, "disable_parallel_tool_use")) {
    if (!p->is_boolean())
      bad("tool_choice.disable_parallel_tool_use", fmt::format("expected a boolean, got {}", type_name(*p)));
    chat["parallel_tool_calls"] = !p->get<bool>();
  }
}

// Gemma 4 thinks or does not: "adaptive" and "between_tools" (the model decides when) are thinking on, as "enabled".
bool thinking_enabled(const json& thinking) {
  expect_object(thinking, "thinking");
  const std::string& type = required_string(thinking, "type", "thinking");
  if (type == "disabled") return false;
  if (type == "adaptive" || type == "between_tools") return true;
  if (type != "enabled")
    bad("thinking.type", fmt::format("\"{}\" is not one of enabled, adaptive, between_tools, disabled", type));
  const json* budget = find(thinking, "budget_tokens");
  if (!budget) bad("thinking.budget_tokens", "Field required");
  if (!budget->is_number_integer() || budget->get<int64_t>() < 1)
    bad("thinking.budget_tokens", fmt::format("expected a positive integer, got {}", budget->dump()));
  return true;
}

// Fields the chat parser reads under the same name and checks itself (types, ranges).
void copy_sampling(const json& body, json& chat) {
  for (const char* name : {"temperature", "top_p", "top_k"})
    if (const json* v = find(body, name)) chat[name] = *v;
}

void convert_options(const json& body, json& chat, MessagesEndpoint endpoint) {
  if (const json* model = find(body, "model")) {
    if (!model->is_string()) bad("model", fmt::format("expected a string, got {}", type_name(*model)));
    chat["model"] = *model;
  }
  if (endpoint == MessagesEndpoint::Create) {
    const json* max_tokens = find(body, "max_tokens");
    if (!max_tokens) bad("max_tokens", "Field required");
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1)
      bad("max_tokens", fmt::format("expected an integer of at least 1, got {}", max_tokens->dump()));
    chat["max_tokens"] = *max_tokens;
    if (const json* stream = find(body, "stream")) {
      if (!stream->is_boolean()) bad("stream", fmt::format("expected a boolean, got {}", type_name(*stream)));
      chat["stream"] = *stream;
    }
    if (const json* stops = find(body, "stop_sequences")) {
      if (!stops->is_array()) bad("stop_sequences", fmt::format("expected an array of strings, got {}", type_name(*stops)));
      for (size_t i = 0; i < stops->size(); ++i)
        if (!(*stops)[i].is_string())
          bad(fmt::format("stop_sequences.{}", i), fmt::format("expected a string, got {}", type_name((*stops)[i])));
      chat["stop"] = *stops;
    }
    copy_sampling(body, chat);
  }
  if (const json* metadata = find(body, "metadata")) expect_object(*metadata, "metadata");
  if (const json* thinking = find(body, "thinking"))
    chat["chat_template_kwargs"] = {{"enable_thinking", thinking_enabled(*thinking)}};
  if (const json* tools = find(body, "tools")) chat["tools"] = convert_tools(*tools);
  if (const json* choice = find(body, "tool_choice")) convert_tool_choice(*choice, chat);
}

// Anthropic's path for a chat parameter the chat parser refused, where the names differ.
std::string anthropic_field(const std::string& chat_param) {
  if (chat_param == "stop") return "stop_sequences";
  if (chat_param == "parallel_tool_calls") return "tool_choice.disable_parallel_tool_use";
  if (chat_param == "chat_template_kwargs") return "thinking";
  return chat_param;
}

// The chat parser's refusals, with the field they name in front of the message (Anthropic's errors have no param).
template <typename F>
auto with_anthropic_fields(F&& parse) {
  try {
    return parse();
  } catch (const ApiError& e) {
    const std::string field = anthropic_field(e.param());
    const std::string message = e.what();
    // Already led by the field: "messages[2].content[0]: ..." names a part of the converted conversation.
    for (const std::string& lead : {field + ":", field + ".", e.param() + "["})
      if (message.starts_with(lead)) throw;
    if (field.empty()) throw;
    throw ApiError(e.status(), fmt::format("{}: {}", field, message), field, e.type(), e.code());
  }
}

}  // namespace

json messages_to_chat_body(const json& body, MessagesEndpoint endpoint) {
  json chat = json::object();
  json messages = json::array();
  if (const json* system = find(body, "system"))
    messages.push_back({{"role", "system"}, {"content", text_blocks(*system, "system", false)}});
  const json* conversation = find(body, "messages");
  if (!conversation) bad("messages", "Field required");
  if (!conversation->is_array()) bad("messages", fmt::format("expected an array, got {}", type_name(*conversation)));
  if (conversation->empty()) bad("messages", "at least one message is required");
  ConversationConverter converter(messages);
  for (size_t i = 0; i < conversation->size(); ++i) converter.add((*conversation)[i], i);
  chat["messages"] = std::move(messages);
  convert_options(body, chat, endpoint);
  return chat;
}

CompletionRequest parse_messages_request(const json& body, const ServedModel& model) {
  const json chat = messages_to_chat_body(body, MessagesEndpoint::Create);
  return with_anthropic_fields([&] { return parse_chat_request(chat, model); });
}

int64_t count_message_tokens(const json& body, const ServedModel& model) {
  const json chat = messages_to_chat_body(body, MessagesEndpoint::CountTokens);
  return with_anthropic_fields([&] { return static_cast<int64_t>(parse_tokenize_request(chat, model).size()); });
}

namespace {

// Anthropic's error type for an HTTP status (its API reference, "Errors").
std::string_view anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

}  // namespace

ojson anthropic_error_body(const ApiError& error) {
  ojson e;
  e["type"] = anthropic_error_type(error.status());
  e["message"] = error.what();
  ojson body;
  body["type"] = "error";
  body["error"] = std::move(e);
  return body;
}

}  // namespace qs
