#include "text/chat_template.h"

#include <fmt/format.h>

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/model_config.h"
#include "util/error.h"
#include "util/file.h"

namespace qs {
namespace {

constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";

// The non-ASCII code points Python's str.isspace() accepts, UTF-8 encoded.
constexpr std::array<std::string_view, 19> kUnicodeSpaces = {
    "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83",
    "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A",
    "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};

bool is_ascii_space(char c) { return (c >= '\t' && c <= '\r') || (c >= '\x1C' && c <= ' '); }

size_t leading_space_bytes(std::string_view s) {
  if (s.empty()) return 0;
  if (is_ascii_space(s.front())) return 1;
  for (std::string_view space : kUnicodeSpaces)
    if (s.starts_with(space)) return space.size();
  return 0;
}

size_t trailing_space_bytes(std::string_view s) {
  if (s.empty()) return 0;
  if (is_ascii_space(s.back())) return 1;
  for (std::string_view space : kUnicodeSpaces)
    if (s.ends_with(space)) return space.size();
  return 0;
}

enum class Role { System, Developer, User, Assistant };

Role parse_role(const std::string& role, size_t index) {
  if (role == "system") return Role::System;
  if (role == "developer") return Role::Developer;
  if (role == "user") return Role::User;
  if (role == "assistant") return Role::Assistant;
  std::string hint;
  if (role == "model") hint = " (write the model's turns as 'assistant')";
  if (role == "tool") hint = " (tool messages, tool calls and tool responses are not supported)";
  throw Error(
      fmt::format("chat message {}: role '{}' is not one of system, developer, user, assistant{}", index, role, hint));
}

bool is_system_like(Role r) { return r == Role::System || r == Role::Developer; }

void append_system_turn(std::string& out, const ChatMessage* system, const ChatOptions& options) {
  out += "<|turn>system\n";
  if (options.enable_thinking) out += options.dialect.newline_after_think ? "<|think|>\n" : "<|think|>";
  if (system) out += python_strip(system->content);
  out += "<turn|>\n";
}

void append_generation_prompt(std::string& out, const ChatOptions& options) {
  out += "<|turn>model\n";
  if (options.enable_thinking && options.dialect.open_thought_channel) out += "<|channel>thought\n";
  if (!options.enable_thinking && options.dialect.empty_thought_channel) out += "<|channel>thought\n<channel|>";
}

// --- dialect detection ------------------------------------------------------------------------------------------

// The Jinja source spells the newline inside string literals as the two characters backslash, n.
constexpr std::string_view kOpenChannelLiteral = R"(<|channel>thought\n)";
constexpr std::string_view kEmptyChannelLiteral = R"(<|channel>thought\n<channel|>)";

// The text of the last `{% ... %}` tag that starts before `pos`.
std::string_view enclosing_tag(std::string_view text, size_t pos) {
  size_t open = text.rfind("{%", pos);
  if (open == std::string_view::npos) return {};
  size_t close = text.find("%}", open);
  return text.substr(open, close == std::string_view::npos ? std::string_view::npos : close + 2 - open);
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// What the generation-prompt branch does with the thought channel. Each `<|channel>thought\n` literal there is
// classified by the `{% if %}` / `{% elif %}` directly around it: `not enable_thinking` -> the empty closed
// channel; `enable_thinking` -> an opened channel, unless the condition is about a preceding tool response (later
// templates open the channel only after tool results, which this renderer never produces).
void detect_generation_prompt_channel(std::string_view branch, Gemma4ChatDialect& dialect) {
  for (size_t pos = branch.find(kOpenChannelLiteral); pos != std::string_view::npos;
       pos = branch.find(kOpenChannelLiteral, pos + 1)) {
    std::string_view condition = enclosing_tag(branch, pos);
    bool closed = branch.substr(pos).starts_with(kEmptyChannelLiteral);
    if (contains(condition, "tool_response") || contains(condition, "tool_call")) continue;
    if (!contains(condition, "enable_thinking"))
      throw Error(
          fmt::format("chat template: the generation prompt emits '{}' under '{}', which does not say "
                      "whether thinking is on; cannot tell when to emit it",
                      closed ? kEmptyChannelLiteral : kOpenChannelLiteral, condition));
    bool negated = contains(condition, "not enable_thinking") || contains(condition, "not (enable_thinking");
    if (closed && negated) dialect.empty_thought_channel = true;
    if (!closed && !negated) dialect.open_thought_channel = true;
  }
}


// tokenizer_config.json's "chat_template": a string, or a list of {name, template} where "default" is the one
// transformers applies.
std::string template_from_tokenizer_config(const std::filesystem::path& path) {
  auto config = nlohmann::json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("chat_template")) return {};
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& entry : t)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  return {};
}

}  // namespace

std::string_view python_strip(std::string_view text) {
  while (size_t n = leading_space_bytes(text)) text.remove_prefix(n);
  while (size_t n = trailing_space_bytes(text)) text.remove_suffix(n);
  return text;
}

std::string strip_thinking(std::string_view text) {
  std::string kept;
  // Python: for part in text.split('<channel|>'): keep part.split('<|channel>')[0].
  while (true) {
    size_t close = text.find(kChannelClose);
    std::string_view part = text.substr(0, close);
    kept += part.substr(0, part.find(kChannelOpen));
    if (close == std::string_view::npos) break;
    text.remove_prefix(close + kChannelClose.size());
  }
  return std::string(python_strip(kept));
}

std::string render_gemma4_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  // The templates read messages[0] unconditionally; jinja2 fails on an empty list, and so do we, clearly.
  if (messages.empty()) throw Error("chat messages: the conversation is empty; expected at least one message");
  std::vector<Role> roles;
  roles.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) roles.push_back(parse_role(messages[i].role, i));

  std::string out = options.bos_token;
  // Only a leading system/developer message goes into the system turn; a later one gets a turn of its own.
  size_t first = is_system_like(roles[0]) ? 1 : 0;
  if (options.enable_thinking || first == 1) append_system_turn(out, first ? &messages[0] : nullptr, options);

  for (size_t i = first; i < messages.size(); ++i) {
    bool assistant = roles[i] == Role::Assistant;
    bool continues_turn =
        options.dialect.merge_adjacent_assistant && assistant && i > first && roles[i - 1] == Role::Assistant;
    if (!continues_turn) out += fmt::format("<|turn>{}\n", assistant ? "model" : messages[i].role);
    // Earlier model turns lose their thinking, as the templates' strip_thinking does.
    out += assistant ? strip_thinking(messages[i].content) : std::string(python_strip(messages[i].content));
    out += "<turn|>\n";
  }
  if (options.add_generation_prompt) append_generation_prompt(out, options);
  return out;
}

Gemma4ChatDialect gemma4_chat_dialect_from_template(std::string_view jinja_text) {
  Gemma4ChatDialect dialect;
  dialect.newline_after_think = contains(jinja_text, R"(<|think|>\n)");
  // Named after the variable the revisions that merge adjacent assistant messages use for it.
  dialect.merge_adjacent_assistant = contains(jinja_text, "continue_same_model_turn");
  dialect.has_thinking_switch = contains(jinja_text, "enable_thinking");
  size_t branch = jinja_text.rfind("add_generation_prompt");
  if (branch != std::string_view::npos) detect_generation_prompt_channel(jinja_text.substr(branch), dialect);
  return dialect;
}

Gemma4ChatDialect gemma4_chat_dialect_from_config(const Gemma4TextConfig& config) {
  Gemma4ChatDialect dialect;
  dialect.empty_thought_channel = !config.has_ple();  // 26B/31B: no per-layer embeddings
  return dialect;
}

Gemma4ChatDialect gemma4_chat_dialect_for_checkpoint(const std::filesystem::path& checkpoint_dir,
                                                     const Gemma4TextConfig& config) {
  auto jinja = checkpoint_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) return gemma4_chat_dialect_from_template(read_file(jinja));
  auto tokenizer_config = checkpoint_dir / "tokenizer_config.json";
  if (std::filesystem::exists(tokenizer_config)) {
    std::string text = template_from_tokenizer_config(tokenizer_config);
    if (!text.empty()) return gemma4_chat_dialect_from_template(text);
  }
  return gemma4_chat_dialect_from_config(config);
}

}  // namespace qs
