// libFuzzer target: conversations rendered by the Gemma 4 chat template (src/text/chat_template.*). The rest of the
// input after the first byte is JSON {"messages": [...], "tools": [...]}, read leniently (a missing or mistyped
// field is empty; tool-call arguments and tool parameters may be any JSON, which is more than the OpenAI parser
// lets through). The first byte: bit 0 enable_thinking, bit 1 add_generation_prompt, bits 2-3 the dialect (the
// early template, the later revision, or bits 4-7 and the second input byte as arbitrary dialect fields); 0xFF
// instead reads the rest as a chat_template.jinja text whose dialect is detected. Rendering throws a qs::Error or
// returns a prompt starting with <bos>; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"
#include "util/error.h"
#include "util/file.h"

namespace {

using nlohmann::json;

std::string string_field(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& field(const json& object, const char* key) {
  static const json null;
  auto it = object.find(key);
  return it != object.end() ? *it : null;
}

qs::ChatToolCall tool_call(const json& c) {
  qs::ChatToolCall call;
  call.id = string_field(c, "id");
  call.name = string_field(c, "name");
  call.arguments = field(c, "arguments");
  return call;
}

qs::ChatMessage message(const json& m) {
  qs::ChatMessage msg;
  msg.role = string_field(m, "role");
  msg.content = string_field(m, "content");
  msg.reasoning_content = string_field(m, "reasoning_content");
  msg.tool_call_id = string_field(m, "tool_call_id");
  msg.name = string_field(m, "name");
  const json& calls = field(m, "tool_calls");
  if (calls.is_array())
    for (const json& c : calls)
      if (c.is_object()) msg.tool_calls.push_back(tool_call(c));
  return msg;
}

qs::ChatTool tool(const json& t) {
  return {string_field(t, "name"), string_field(t, "description"), field(t, "parameters")};
}

qs::Gemma4ChatDialect template_dialect(const char* file) {
  return qs::gemma4_chat_dialect_from_template(qs::read_file(std::string(QATSERVE_SOURCE_DIR) + "/" + file));
}

qs::Gemma4ChatDialect dialect(uint8_t options, uint8_t fields) {
  static const qs::Gemma4ChatDialect early = template_dialect("configs/demo-tokenizer/chat_template.jinja");
  static const qs::Gemma4ChatDialect later =
      template_dialect("tests/data/gemma4-tokenizer/google-gemma-4-31B-it.from-llamacpp-fork.jinja");
  switch ((options >> 2) & 3) {
    case 0: return early;
    case 1: return later;
  }
  const unsigned bits = (options >> 4) | (fields << 4);
  qs::Gemma4ChatDialect d;
  d.empty_thought_channel = bits & 1;
  d.open_thought_channel = bits & 2;
  d.newline_after_think = bits & 4;
  d.merge_adjacent_assistant = bits & 8;
  d.has_thinking_switch = bits & 16;
  d.tool_results_in_model_turn = bits & 32;
  d.early_parameter_layout = bits & 64;
  return d;
}

void render(uint8_t options, uint8_t fields, std::string_view text) {
  json conversation = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!conversation.is_object()) return;
  std::vector<qs::ChatMessage> messages;
  if (const json& ms = field(conversation, "messages"); ms.is_array())
    for (const json& m : ms)
      if (m.is_object()) messages.push_back(message(m));
  qs::ChatOptions chat;
  if (const json& ts = field(conversation, "tools"); ts.is_array())
    for (const json& t : ts)
      if (t.is_object()) chat.tools.push_back(tool(t));
  chat.enable_thinking = options & 1;
  chat.add_generation_prompt = options & 2;
  chat.dialect = dialect(options, fields);
  try {
    if (!qs::render_gemma4_chat(messages, chat).starts_with(chat.bos_token)) std::abort();
  } catch (const qs::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if (data[0] == 0xFF) {
    try {
      (void)qs::gemma4_chat_dialect_from_template(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    } catch (const qs::Error&) {
    }
    return 0;
  }
  render(data[0], data[1], rest);
  return 0;
}
