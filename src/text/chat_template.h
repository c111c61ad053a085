#pragma once
// Gemma 4 chat prompts, rendered natively (no Jinja engine): what Google's chat_template.jinja produces for
// OpenAI-style messages: text, tool declarations, tool calls, tool results, reasoning, and the markers of image and
// audio parts (<|image|>, <|audio|>: the processor expands each into the media's soft tokens).
//
//   <bos>[<|turn>system\n[<|think|>[\n]]SYSTEM[<|tool>declaration:NAME{...}<tool|>...]<turn|>\n]
//                                    when thinking is on, tools are declared or messages[0] is system/developer
//   <|turn>ROLE\n[<|tool_call>call:NAME{key:value,...}<tool_call|>...]CONTENT<turn|>\n ...
//                                    assistant -> model; content trimmed as Python's strip()
//   <|turn>model\n[<|channel>thought\n[<channel|>]]            the generation prompt; its tail depends on the dialect
//
// Tool results are `role: "tool"` turns in the early templates; the later revision folds them into the model turn
// that made the calls (<|tool_response>response:NAME{value:...}<tool_response|>, NAME found by tool_call_id).
//
// The Gemma 4 templates differ between sizes and revisions in a few places (Gemma4ChatDialect); the dialect is read
// from a checkpoint's template text when there is one, and guessed from the model config otherwise.
// tests/golden/chat_gemma4.json (tools/python/make_chat_golden.py) holds this to jinja2's output byte for byte.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

struct Gemma4TextConfig;

// One call an assistant message made (OpenAI `tool_calls[i]`).
struct ChatToolCall {
  std::string id;
  std::string name;
  // A JSON object is written key:value in the template's format_argument syntax; a string is written as it is (as
  // the template does with unparsed arguments); anything else writes nothing between the braces.
  nlohmann::json arguments = nlohmann::json::object();
};

// A part of a message whose content is a list (user and assistant turns render each as the templates do).
struct ChatContentPart {
  enum class Kind { Text, Image, Audio } kind = Kind::Text;
  std::string text;  // Text
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  std::string content;
  // When the content was a list of parts: rendered part by part (text trimmed, media as markers), not `content`.
  std::vector<ChatContentPart> parts;
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string reasoning_content;         // assistant: its thoughts (rendered by the later revision before its calls)
  std::string tool_call_id;              // tool: the call it answers
  std::string name;                      // tool: the function's name, when the id matches no call
};

// One function the model may call, declared in the system turn (OpenAI `tools[i].function`).
struct ChatTool {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // a JSON Schema object; null = no parameters
};

// The places where Gemma 4 chat templates disagree. Every field is what one real template does.
struct Gemma4ChatDialect {
  // Thinking off: the generation prompt is followed by an empty, closed thought channel
  // `<|channel>thought\n<channel|>`, which keeps the model from thinking (12B/26B/31B templates; E2B/E4B do not).
  bool empty_thought_channel = false;
  // Thinking on: the generation prompt is followed by an opened `<|channel>thought\n` (a later 31B revision).
  bool open_thought_channel = false;
  // Thinking on: the system turn starts `<|think|>\n` (later revisions) rather than `<|think|>` (early ones).
  bool newline_after_think = true;
  // An assistant message right after another assistant message continues the same model turn (no second
  // `<|turn>model\n`), as the later revision that folds tool results into model turns does.
  bool merge_adjacent_assistant = false;
  // The template switches thinking on with `enable_thinking` (every released Gemma 4 template does; a reduced one
  // may not): clients such as the chat page offer the switch only then.
  bool has_thinking_switch = true;
  // `role: "tool"` messages are folded into the model turn that made the calls, as <|tool_response> blocks named
  // through tool_call_id; the model turn then stays open, the assistant's reasoning_content is rendered before its
  // calls, and the generation prompt adds nothing after calls or results (the later revision). Otherwise a tool
  // message is a `<|turn>tool` turn of its own.
  bool tool_results_in_model_turn = false;
  // Tool declarations: the early templates' property layout (`,properties:{` / `,items:{` written without the
  // comma bookkeeping, the first entry of a type list) rather than the later one (the whole type list's repr).
  bool early_parameter_layout = false;
  // An image part renders as `\n\n<|image|>\n\n` (llama.cpp's copy of the template) rather than `<|image|>`.
  bool spaced_image_marker = false;

  bool operator==(const Gemma4ChatDialect&) const = default;
};

struct ChatOptions {
  std::vector<ChatTool> tools;
  bool add_generation_prompt = true;
  bool enable_thinking = false;
  std::string bos_token = "<bos>";
  Gemma4ChatDialect dialect;
};

// Throws qs::Error for an empty conversation, a role other than system, developer, user, assistant and tool, and
// whatever the template itself fails on (an untyped tool parameter in the early layout; a tool result whose
// tool_call_id matches no call and that has no name when results are folded), naming the message or tool.
std::string render_gemma4_chat(std::span<const ChatMessage> messages, const ChatOptions& options);

// The dialect a chat_template.jinja text speaks, read from the literals it emits (see the .cc for the rules).
// Throws qs::Error when the generation prompt opens a thought channel under a condition it cannot place.
Gemma4ChatDialect gemma4_chat_dialect_from_template(std::string_view jinja_text);

// Without a template: E2B/E4B (per-layer embeddings) add nothing after the generation prompt, 26B/31B add the
// empty thought channel; both as the current released templates write `<|think|>\n`.
Gemma4ChatDialect gemma4_chat_dialect_from_config(const Gemma4TextConfig& config);

// From the checkpoint's chat_template.jinja, else the "chat_template" of its tokenizer_config.json, else the config.
Gemma4ChatDialect gemma4_chat_dialect_for_checkpoint(const std::filesystem::path& checkpoint_dir,
                                                     const Gemma4TextConfig& config);

// Jinja's `trim` filter, i.e. Python's str.strip(): removes leading and trailing Unicode whitespace
// (str.isspace: ASCII \t\n\v\f\r, 0x1C-0x1F and space, plus U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000), not just ASCII.
std::string_view python_strip(std::string_view text);

// The templates' strip_thinking macro: drops every `<|channel>...<channel|>` block (and an unclosed
// `<|channel>...` tail) from a model turn, then strips.
std::string strip_thinking(std::string_view text);

// The templates' format_argument macro: strings in <|"|>, true/false, None, numbers as Python prints them,
// mappings with keys in dictsort order (case-insensitive), quoted in <|"|> when escape_keys, lists in [].
std::string format_tool_argument(const nlohmann::json& value, bool escape_keys);

}  // namespace qs
