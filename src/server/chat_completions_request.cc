// POST /v1/chat/completions bodies (parse_chat_request in openai_protocol.h): messages, tools and tool_choice,
// thinking, response_format, logprobs, and the media of the messages prepared for the engine.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>

#include "server/image_budget.h"
#include "server/openai_protocol.h"
#include "server/openai_request.h"
#include "server/request_fields.h"
#include "text/tokenizer.h"

namespace qs {

using json = nlohmann::json;
using namespace request_fields;

namespace {

// Thinking: chat_template_kwargs.enable_thinking (vLLM's convention), or reasoning_effort: "none" is off, any
// other effort (minimal, low, medium, high) is on; Gemma 4 has no levels.
bool thinking_requested(const json& body) {
  bool on = false;
  if (auto* v = find(body, "reasoning_effort")) on = as_string(*v, "reasoning_effort") != "none";
  if (auto* v = find(body, "chat_template_kwargs")) {
    if (!v->is_object())
      bad("chat_template_kwargs", fmt::format("chat_template_kwargs must be an object, got {}", describe(*v)));
    if (auto* t = find(*v, "enable_thinking")) on = as_bool(*t, "chat_template_kwargs.enable_thinking");
  }
  return on;
}

struct ToolChoice {
  enum class Mode { Auto, None, Required, Named } mode = Mode::Auto;
  std::string name;
};

ToolChoice parse_tool_choice(const json& body, std::span<const ChatTool> tools) {
  ToolChoice choice;
  const json* v = find(body, "tool_choice");
  if (!v) return choice;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s == "auto") choice.mode = ToolChoice::Mode::Auto;
    else if (s == "none") choice.mode = ToolChoice::Mode::None;
    else if (s == "required") choice.mode = ToolChoice::Mode::Required;
    else bad("tool_choice", fmt::format("tool_choice \"{}\" is not one of auto, none, required", s));
  } else {
    const json* function = v->is_object() ? find(*v, "function") : nullptr;
    const json* name = function && function->is_object() ? find(*function, "name") : nullptr;
    if (!name || !name->is_string())
      bad("tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}");
    choice.mode = ToolChoice::Mode::Named;
    choice.name = name->get<std::string>();
    if (std::none_of(tools.begin(), tools.end(), [&](const ChatTool& t) { return t.name == choice.name; }))
      bad("tool_choice", fmt::format("tool_choice names function '{}', which is not in tools", choice.name));
  }
  if ((choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named) && tools.empty())
    bad("tool_choice", "tool_choice requires a tool call but no tools were given");
  return choice;
}

ToolSpec tool_spec(const ChatTool& tool) {
  return {tool.name, tool.description, tool.parameters.is_null() ? json::object() : tool.parameters};
}


// What a chat request asks the output to obey: a forced tool call wins over response_format (as vLLM: the tool
// call is the answer); with tool_choice auto, response_format's JSON or calls to the tools (as OpenAI: an agent
// with tools and a structured answer, the openai-agents SDK's output_type, calls its tools first); with tools and
// tool_choice auto alone, free text, but a call the model opens is held to the tools (`lazy_calls`, llama.cpp's
// lazy grammar: a weak model's call still names a declared tool with valid arguments).
ConstraintSpec chat_constraint(const json& body, std::span<const ChatTool> tools, const ToolChoice& choice,
                               bool thinking, bool lazy_calls) {
  ConstraintSpec spec = response_format_constraint(body);
  const json* parallel = find(body, "parallel_tool_calls");
  const bool parallel_calls = !parallel || as_bool(*parallel, "parallel_tool_calls");
  const bool forced = choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named;
  const bool auto_calls = choice.mode == ToolChoice::Mode::Auto && !tools.empty();
  const bool lazy = auto_calls && !spec.active() && lazy_calls;
  if (forced || lazy) {
    spec = {};
    spec.kind = ConstraintSpec::Kind::ToolCalls;
  }
  if (forced || (spec.active() && auto_calls)) {
    for (const ChatTool& t : tools)
      if (choice.mode != ToolChoice::Mode::Named || t.name == choice.name) spec.tools.push_back(tool_spec(t));
    spec.parallel_calls = parallel_calls;
  }
  using Start = ConstraintSpec::Start;
  spec.start = lazy ? Start::AtToolCall : spec.active() && thinking ? Start::AfterThinking : Start::Now;
  return spec;
}

}  // namespace

ChatPrompt chat_prompt_from_body(const json& body, const ServedModel& model) {
  const json* messages = find(body, "messages");
  if (!messages) bad("messages", "messages is required");
  ChatPrompt out;
  std::vector<ChatMessage> parsed = parse_chat_messages(*messages, model.media, out.media);
  apply_image_soft_tokens(out.media, request_image_soft_tokens(body, model.media));
  bool add_generation_prompt = true;
  if (auto* v = find(body, "add_generation_prompt")) add_generation_prompt = as_bool(*v, "add_generation_prompt");
  const bool thinking = thinking_requested(body);
  std::vector<ChatTool> tools;
  if (auto* v = find(body, "tools")) tools = parse_tools(*v);
  ToolChoice choice = parse_tool_choice(body, tools);

  // tool_choice none still declares the tools (vLLM's default) but reads no calls back.
  std::string text = chat_prompt_text(parsed, model, add_generation_prompt, thinking, tools);
  out.tokens = model.tokenizer->encode(text);
  out.parsing.tool_calls = !tools.empty() && choice.mode != ToolChoice::Mode::None;
  out.parsing.reasoning = thinking;
  out.parsing.enabled = out.parsing.tool_calls || thinking;
  out.parsing.starts_in_thought = text.ends_with("<|channel>thought\n");
  out.constraint = chat_constraint(body, tools, choice, thinking, model.tool_call_grammar);
  return out;
}

CompletionRequest parse_chat_request(const json& body, const ServedModel& model) {
  const ModelChoice chosen = resolve_model(body, model);
  CompletionRequest r = chat_request_from_prompt(body, model, chat_prompt_from_body(body, model), "messages");
  apply_model_choice(r, chosen);
  return r;
}

CompletionRequest chat_request_from_prompt(const json& body, const ServedModel& model, ChatPrompt prompt,
                                           const std::string& media_param) {
  std::vector<MediaSpan> spans;
  if (!prompt.media.empty() && model.prepare_media) {
    try {
      MediaPrompt expanded = model.prepare_media(prompt.tokens, prompt.media);
      prompt.tokens = std::move(expanded.tokens);
      spans = std::move(expanded.spans);
      prompt.media.clear();
    } catch (const Error& e) {
      bad(media_param, e.what());
    }
  }
  LogprobOptions lp;
  if (auto* v = find(body, "logprobs")) lp.enabled = as_bool(*v, "logprobs");
  if (auto* v = find(body, "top_logprobs")) {
    lp.top = static_cast<int32_t>(as_integer_in(*v, "top_logprobs", 0, kMaxTopLogprobs));
    if (lp.top > 0 && !lp.enabled) bad("top_logprobs", "top_logprobs needs logprobs to be true");
  }
  lp.tokens_as_ids = tokens_as_ids(body);
  CompletionRequest r = build_request(ApiKind::Chat, body, model, std::move(prompt.tokens), lp);
  r.parsing = prompt.parsing;
  r.media = std::move(prompt.media);
  for (EngineRequest& e : r.choices) {
    e.constraint = prompt.constraint;
    e.keep_chat_markers = prompt.parsing.enabled;  // the splitter reads the template's markers
    e.media = spans;
  }
  return r;
}

}  // namespace qs
