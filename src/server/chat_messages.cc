// Chat messages and tools as OpenAI sends them (parse_chat_messages, parse_tools in openai_protocol.h), and the
// prompt the checkpoint's chat template renders of them: Chat Completions, /tokenize, the Responses API (through
// the chat body it converts to) and the command line's --messages read them here.
#include <fmt/format.h>

#include "server/image_budget.h"
#include "server/openai_protocol.h"
#include "server/request_fields.h"
#include "text/tokenizer.h"

namespace qs {

using json = nlohmann::json;
using namespace request_fields;

namespace {

// One image or audio part: its bytes decoded, where it came from, checked against what the model reads.
media::MediaInput media_part(const json& part, const std::string& type, const std::string& where,
                             const MediaOptions& options) {
  const bool image = type == "image_url";
  const media::MediaKind kind = image ? media::MediaKind::Image : media::MediaKind::Audio;
  if (image ? !options.images : !options.audio)
    bad("messages", fmt::format("{}: this model does not read {} input (no {} tower is loaded)", where,
                                media::media_kind_name(kind), image ? "vision" : "audio"));
  try {
    if (image) {
      const json* holder = find(part, "image_url");
      const json* url = holder && holder->is_object() ? find(*holder, "url") : nullptr;
      if (!url || !url->is_string())
        bad("messages", fmt::format("{}.image_url.url is required (a data:image/...;base64 URL)", where));
      const std::string& text = url->get_ref<const std::string&>();
      const size_t colon = text.find(':');
      const std::string scheme = colon <= 5 ? media::ascii_lower(text.substr(0, colon)) : "";
      if ((scheme == "http" || scheme == "https") && !options.fetch.enabled())
        bad("messages", fmt::format("{}.image_url.url: this server does not fetch images from URLs (its operator "
                                    "allows hosts with --allowed-media-domains); send the image as a "
                                    "data:image/...;base64 URL",
                                    where));
      if (scheme == "http" || scheme == "https")
        return media::fetch_media(text, kind, options.fetch, options.max_bytes, where + ".image_url.url");
      return media::parse_data_url(text, kind, options.max_bytes, where + ".image_url.url");
    }
    const json* holder = find(part, "input_audio");
    const json* data = holder && holder->is_object() ? find(*holder, "data") : nullptr;
    const json* format = holder && holder->is_object() ? find(*holder, "format") : nullptr;
    if (!data || !data->is_string() || !format || !format->is_string())
      bad("messages", fmt::format("{}.input_audio needs data (base64) and format (\"wav\", \"mp3\", ...)", where));
    media::MediaInput input;
    input.kind = kind;
    input.declared_format = format->get<std::string>();
    input.bytes = media::decode_base64(data->get_ref<const std::string&>(), options.max_bytes, where + ".input_audio.data");
    input.where = where;
    return input;
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

// A message's content: a string, a list of parts, or null/absent (empty). Text parts of system, developer and tool
// messages are joined by newlines (the templates print those contents whole); user and assistant parts are kept
// for the template to render one by one, media parts becoming markers and their bytes appended to `media`.
void message_content(const json& m, size_t i, ChatMessage& msg, const MediaOptions& options,
                     std::vector<media::MediaInput>& media) {
  const json* content = find(m, "content");
  if (!content || content->is_null()) return;
  if (content->is_string()) {
    msg.content = content->get<std::string>();
    return;
  }
  if (!content->is_array())
    bad("messages", fmt::format("messages[{}].content must be a string or an array of parts, got {}", i,
                                describe(*content)));
  const bool turn_parts = msg.role == "user" || msg.role == "assistant";
  for (size_t k = 0; k < content->size(); ++k) {
    const json& part = (*content)[k];
    const std::string where = fmt::format("messages[{}].content[{}]", i, k);
    const json* type = part.is_object() ? find(part, "type") : nullptr;
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "";
    if (kind == "text") {
      const json* t = find(part, "text");
      if (!t || !t->is_string()) bad("messages", fmt::format("{}.text must be a string", where));
      if (!msg.content.empty()) msg.content += "\n";
      msg.content += t->get<std::string>();
      msg.parts.push_back({ChatContentPart::Kind::Text, t->get<std::string>()});
    } else if ((kind == "image_url" || kind == "input_audio") && turn_parts) {
      if (media.size() >= static_cast<size_t>(options.max_items))
        bad("messages", fmt::format("{}: a request may carry at most {} images and audio clips", where, options.max_items));
      media.push_back(media_part(part, kind, where, options));
      if (kind == "image_url")
        media.back().image_soft_tokens = image_detail_soft_tokens(part.at("image_url"), options, where + ".image_url");
      msg.parts.push_back({kind == "image_url" ? ChatContentPart::Kind::Image : ChatContentPart::Kind::Audio, ""});
    } else if (kind == "image_url" || kind == "input_audio") {
      bad("messages", fmt::format("{}: {} parts are read in user and assistant messages only, not in a {} message",
                                  where, kind, msg.role));
    } else {
      bad("messages", fmt::format("{}: the part type must be \"text\", \"image_url\" or \"input_audio\"", where));
    }
  }
  if (!turn_parts) msg.parts.clear();
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments: JSON string}}]. The
// arguments reach the template parsed, as vLLM passes them (an empty string is {}).
std::vector<ChatToolCall> message_tool_calls(const json& calls, size_t i) {
  const std::string where = fmt::format("messages[{}].tool_calls", i);
  if (!calls.is_array()) bad("messages", fmt::format("{} must be an array, got {}", where, describe(calls)));
  std::vector<ChatToolCall> out;
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const json* function = c.is_object() ? find(c, "function") : nullptr;
    const json* name = function && function->is_object() ? find(*function, "name") : nullptr;
    if (!name || !name->is_string())
      bad("messages", fmt::format("{}[{}].function.name must be a string", where, j));
    ChatToolCall call;
    call.name = name->get<std::string>();
    if (auto* id = find(c, "id")) call.id = as_string(*id, "messages");
    const json* arguments = find(*function, "arguments");
    if (arguments && arguments->is_string() && !arguments->get_ref<const std::string&>().empty()) {
      call.arguments = parse_request_json(arguments->get_ref<const std::string&>(), "messages",
                                          fmt::format("{}[{}].function.arguments", where, j));
    } else if (arguments && arguments->is_object()) {
      call.arguments = *arguments;
    }
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

std::vector<ChatMessage> parse_chat_messages(const json& messages, const MediaOptions& options,
                                            std::vector<media::MediaInput>& media) {
  if (!messages.is_array())
    bad("messages", fmt::format("messages must be an array of {{role, content}} objects, got {}", describe(messages)));
  if (messages.empty()) bad("messages", "messages must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) bad("messages", fmt::format("messages[{}] must be an object, got {}", i, describe(m)));
    const json* role = find(m, "role");
    if (!role || !role->is_string()) bad("messages", fmt::format("messages[{}].role must be a string", i));
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool")
      bad("messages", fmt::format("messages[{}].role \"{}\" is not supported; expected system, developer, user, "
                                  "assistant or tool",
                                  i, msg.role));
    message_content(m, i, msg, options, media);
    if (msg.role == "assistant") {
      if (auto* calls = find(m, "tool_calls")) msg.tool_calls = message_tool_calls(*calls, i);
      for (const char* field : {"reasoning_content", "reasoning"})
        if (auto* r = find(m, field); r && msg.reasoning_content.empty()) msg.reasoning_content = as_string(*r, "messages");
    }
    if (msg.role == "tool") {
      const json* id = find(m, "tool_call_id");
      if (!id || !id->is_string())
        bad("messages", fmt::format("messages[{}].tool_call_id is required for a tool message (the id of the call it "
                                    "answers)",
                                    i));
      msg.tool_call_id = id->get<std::string>();
      if (auto* name = find(m, "name")) msg.name = as_string(*name, "messages");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<ChatTool> parse_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", fmt::format("tools must be an array, got {}", describe(tools)));
  std::vector<ChatTool> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const json* type = t.is_object() ? find(t, "type") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "function")
      bad("tools", fmt::format("tools[{}].type must be \"function\"", i));
    const json* function = find(t, "function");
    if (!function || !function->is_object())
      bad("tools", fmt::format("tools[{}].function must be an object", i));
    const json* name = find(*function, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      bad("tools", fmt::format("tools[{}].function.name is required (a non-empty string)", i));
    ChatTool tool;
    tool.name = name->get<std::string>();
    if (auto* d = find(*function, "description")) tool.description = as_string(*d, "tools");
    if (auto* p = find(*function, "parameters")) {
      const json* ptype = p->is_object() ? find(*p, "type") : nullptr;
      const json* props = p->is_object() ? find(*p, "properties") : nullptr;
      if (!p->is_object() || (ptype && *ptype != "object") || (props && !props->is_object()))
        bad("tools", fmt::format("tools[{}].function.parameters must be a JSON Schema of an object ({{\"type\": "
                                 "\"object\", \"properties\": {{...}}}}), got {}",
                                 i, p->is_object() ? p->dump() : describe(*p)));
      tool.parameters = *p;
    }
    for (const ChatTool& earlier : out)
      if (earlier.name == tool.name) bad("tools", fmt::format("tools[{}]: function '{}' is declared twice", i, tool.name));
    out.push_back(std::move(tool));
  }
  return out;
}

std::string chat_prompt_text(std::span<const ChatMessage> messages, const ServedModel& model,
                             bool add_generation_prompt, bool enable_thinking, std::span<const ChatTool> tools) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.enable_thinking = enable_thinking;
  options.dialect = model.dialect;
  options.tools.assign(tools.begin(), tools.end());
  try {
    return render_gemma4_chat(messages, options);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

std::vector<int32_t> chat_prompt_tokens(std::span<const ChatMessage> messages, const ServedModel& model,
                                        bool add_generation_prompt, bool enable_thinking) {
  return model.tokenizer->encode(chat_prompt_text(messages, model, add_generation_prompt, enable_thinking, {}));
}

}  // namespace qs
