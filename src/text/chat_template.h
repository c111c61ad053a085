#pragma once
// Gemma 4 chat prompts, rendered natively (no Jinja engine): what Google's chat_template.jinja produces for
// messages that carry only a role and text. Tools, tool calls, tool responses and media parts are not rendered.
//
//   <bos>[<|turn>system\n[<|think|>[\n]]SYSTEM<turn|>\n]      when thinking is on or messages[0] is system/developer
//   <|turn>ROLE\nCONTENT<turn|>\n ...                          assistant -> model; content trimmed as Python's strip()
//   <|turn>model\n[<|channel>thought\n[<channel|>]]            the generation prompt; its tail depends on the dialect
//
// The Gemma 4 templates differ between sizes and revisions in a few places (Gemma4ChatDialect); the dialect is read
// from a checkpoint's template text when there is one, and guessed from the model config otherwise.
// tests/golden/chat_gemma4.json (tools/python/make_chat_golden.py) holds this to jinja2's output byte for byte.
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace qs {

struct Gemma4TextConfig;

struct ChatMessage {
  std::string role;  // system | developer | user | assistant
  std::string content;
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

  bool operator==(const Gemma4ChatDialect&) const = default;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;
  std::string bos_token = "<bos>";
  Gemma4ChatDialect dialect;
};

// Throws qs::Error for an empty conversation or a role other than system, developer, user and assistant.
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

}  // namespace qs
