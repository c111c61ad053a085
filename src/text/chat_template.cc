#include "text/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
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

enum class Role { System, Developer, User, Assistant, Tool };

Role parse_role(const std::string& role, size_t index) {
  if (role == "system") return Role::System;
  if (role == "developer") return Role::Developer;
  if (role == "user") return Role::User;
  if (role == "assistant") return Role::Assistant;
  if (role == "tool") return Role::Tool;
  std::string hint;
  if (role == "model") hint = " (write the model's turns as 'assistant')";
  throw Error(fmt::format("chat message {}: role '{}' is not one of system, developer, user, assistant, tool{}", index,
                          role, hint));
}

bool is_system_like(Role r) { return r == Role::System || r == Role::Developer; }

// --- what Jinja prints and how the templates' macros format values ------------------------------------------------
//
// The templates run in Python: `{{ x }}` prints str(x), mappings iterate through `dictsort` (keys compared
// lower-cased, ties kept in the mapping's order), `x['k']` on a non-mapping or a missing key is Undefined (falsy,
// prints nothing), and `| upper` upper-cases str(x).

constexpr std::string_view kQuote = "<|\"|>";

// Python's repr(float): the shortest digits that round-trip; positional for exponents -4..15 (with ".0" when
// integral), else d[.ddd]e+XX.
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, end);  // -?d[.ddd]e[+-]XX
  bool negative = sci.front() == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    return out + fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  if (digits.size() <= static_cast<size_t>(exponent) + 1) digits.append(exponent + 1 - digits.size(), '0');
  std::string fraction = digits.substr(exponent + 1);
  return out + digits.substr(0, exponent + 1) + "." + (fraction.empty() ? "0" : fraction);
}

std::string python_str(const nlohmann::json& v);

// Python's repr(str) for the plain strings a schema holds: single quotes unless the text has one and no double one.
std::string python_repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == '\\' || c == quote) out += '\\';
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out + quote;
}

std::string python_repr(const nlohmann::json& v) {
  if (v.is_string()) return python_repr_string(v.get<std::string>());
  return python_str(v);
}

// str(x) of the value json.loads would give.
std::string python_str(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::string: return v.get<std::string>();
    case nlohmann::json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case nlohmann::json::value_t::null: return "None";
    case nlohmann::json::value_t::number_float: return python_float(v.get<double>());
    case nlohmann::json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out.append(i ? ", " : "").append(python_repr(v[i]));
      return out + "]";
    }
    case nlohmann::json::value_t::object:
      throw Error(fmt::format("chat template: cannot print the mapping {} where the template prints a value", v.dump()));
    default: return v.dump();  // integers
  }
}

std::string python_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

using Items = std::vector<std::pair<std::string, const nlohmann::json*>>;

// Jinja's dictsort (case-insensitive). nlohmann keeps keys in byte order, so keys equal but for case come out in
// byte order rather than as the request sent them.
Items dictsort(const nlohmann::json& mapping) {
  Items items;
  for (const auto& [key, value] : mapping.items()) items.emplace_back(key, &value);
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return ascii_lower(a.first) < ascii_lower(b.first); });
  return items;
}

// x['key']: the value, or nullptr for Jinja's Undefined.
const nlohmann::json* lookup(const nlohmann::json* x, const char* key) {
  if (!x || !x->is_object()) return nullptr;
  auto it = x->find(key);
  return it == x->end() ? nullptr : &*it;
}

bool truthy(const nlohmann::json* x) {
  if (!x || x->is_null()) return false;
  if (x->is_boolean()) return x->get<bool>();
  if (x->is_number()) return x->get<double>() != 0;
  if (x->is_string()) return !x->get_ref<const std::string&>().empty();
  return !x->empty();
}

std::string printed(const nlohmann::json* x) { return x ? python_str(*x) : ""; }

// `<|"|>a<|"|>,<|"|>b<|"|>` for a list of names.
std::string quoted_list(const nlohmann::json& list) {
  std::string out;
  if (!list.is_array()) throw Error(fmt::format("chat template: 'required' must be a list, got {}", list.dump()));
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) out += ',';
    out.append(kQuote).append(python_str(list[i])).append(kQuote);
  }
  return out;
}

// The templates' `{%- if add_comma %},{%- else -%}{%- set add_comma = true -%}{% endif -%}`.
void separate(std::string& out, bool& add_comma) {
  if (add_comma) out += ',';
  add_comma = true;
}

std::string format_parameters(const nlohmann::json& properties, const Gemma4ChatDialect& dialect);

// An array property's `items` schema, key by key.
std::string format_items(const nlohmann::json& items, const Gemma4ChatDialect& dialect) {
  std::string out;
  bool first = true;
  for (const auto& [key, value] : dictsort(items)) {
    if (value->is_null()) continue;
    if (!first) out += ',';
    first = false;
    if (key == "properties") {
      out += "properties:{" + (value->is_object() ? format_parameters(*value, dialect) : "") + "}";
    } else if (key == "required") {
      out += "required:[" + quoted_list(*value) + "]";
    } else if (key == "type") {
      nlohmann::json upper;
      if (value->is_string()) upper = python_upper(value->get<std::string>());
      else for (const auto& t : *value) upper.push_back(python_upper(python_str(t)));
      out += "type:" + format_tool_argument(upper, true);
    } else {
      out += key + ":" + format_tool_argument(*value, true);
    }
  }
  return out;
}

// The early templates: a property's type is its `type` string or the first entry of its type list (a property
// without one fails the template), and object/array parts are written `,properties:{...}` / `,items:{...}`.
std::string early_property(const std::string& key, const nlohmann::json& value, const Gemma4ChatDialect& dialect) {
  std::string out;
  bool add_comma = false;
  if (auto* d = lookup(&value, "description"); truthy(d)) {
    out += "description:" + std::string(kQuote) + python_str(*d) + std::string(kQuote);
    add_comma = true;
  }
  if (truthy(lookup(&value, "nullable"))) {
    separate(out, add_comma);
    out += "nullable:true";
  }
  const nlohmann::json* type = lookup(&value, "type");
  if (!type)
    throw Error(fmt::format("chat template: tool parameter '{}' has no 'type' (this template needs one)", key));
  const nlohmann::json* first_type = type->is_string() ? type : (type->is_array() && !type->empty() ? &(*type)[0] : nullptr);
  std::string value_type = python_upper(printed(first_type));
  if (value_type == "STRING") {
    if (auto* e = lookup(&value, "enum"); truthy(e)) {
      separate(out, add_comma);
      out += "enum:" + format_tool_argument(*e, true);
    }
  } else if (value_type == "OBJECT") {
    const nlohmann::json* props = lookup(&value, "properties");
    out += ",properties:{";
    if (props && props->is_object()) out += format_parameters(*props, dialect);
    else if (value.is_object()) out += format_parameters(value, dialect);
    out += "}";
    if (auto* r = lookup(&value, "required"); truthy(r)) out += ",required:[" + quoted_list(*r) + "]";
  } else if (value_type == "ARRAY") {
    if (auto* items = lookup(&value, "items"); items && items->is_object() && !items->empty())
      out += ",items:{" + format_items(*items, dialect) + "}";
  }
  separate(out, add_comma);
  return out + "type:" + std::string(kQuote) + value_type + std::string(kQuote) + "}";
}

// The later revision: `type | upper` of whatever `type` is (a list prints as its Python repr), parts written
// after a comma when something precedes them.
std::string later_property(const nlohmann::json& value, const Gemma4ChatDialect& dialect) {
  std::string out;
  bool add_comma = false;
  if (auto* d = lookup(&value, "description"); truthy(d)) {
    out += "description:" + std::string(kQuote) + python_str(*d) + std::string(kQuote);
    add_comma = true;
  }
  std::string value_type = python_upper(printed(lookup(&value, "type")));
  if (value_type == "STRING") {
    if (auto* e = lookup(&value, "enum"); truthy(e)) {
      separate(out, add_comma);
      out += "enum:" + format_tool_argument(*e, true);
    }
  } else if (value_type == "ARRAY") {
    if (auto* items = lookup(&value, "items"); items && items->is_object() && !items->empty()) {
      separate(out, add_comma);
      out += "items:{" + format_items(*items, dialect) + "}";
    }
  }
  if (truthy(lookup(&value, "nullable"))) {
    separate(out, add_comma);
    out += "nullable:true";
  }
  if (value_type == "OBJECT") {
    const nlohmann::json* props = lookup(&value, "properties");
    const nlohmann::json& nested = props && props->is_object() ? *props : value;
    if (nested.is_object()) {
      separate(out, add_comma);
      out += "properties:{" + format_parameters(nested, dialect) + "}";
    }
    if (auto* r = lookup(&value, "required"); truthy(r)) {
      separate(out, add_comma);
      out += "required:[" + quoted_list(*r) + "]";
    }
  }
  separate(out, add_comma);
  return out + "type:" + std::string(kQuote) + value_type + std::string(kQuote) + "}";
}

// The templates' format_parameters macro: every property but the schema keywords it skips, in dictsort order.
std::string format_parameters(const nlohmann::json& properties, const Gemma4ChatDialect& dialect) {
  static const std::array<std::string_view, 5> kStandardKeys = {"description", "type", "properties", "required",
                                                                  "nullable"};
  std::string out;
  bool first = true;
  for (const auto& [key, value] : dictsort(properties)) {
    if (std::find(kStandardKeys.begin(), kStandardKeys.end(), key) != kStandardKeys.end()) continue;
    if (!first) out += ',';
    first = false;
    out += key + ":{";
    out += dialect.early_parameter_layout ? early_property(key, *value, dialect) : later_property(*value, dialect);
  }
  return out;
}

// The templates' format_function_declaration macro (without `response`, which OpenAI tools do not have).
std::string format_declaration(const ChatTool& tool, const Gemma4ChatDialect& dialect) {
  std::string out = "declaration:" + tool.name + "{description:" + std::string(kQuote) + tool.description +
                    std::string(kQuote);
  const nlohmann::json* params = &tool.parameters;
  if (truthy(params)) {
    out += ",parameters:{";
    if (auto* props = lookup(params, "properties"); truthy(props)) {
      if (!props->is_object())
        throw Error(fmt::format("chat template: tool '{}': parameters.properties must be an object", tool.name));
      out += "properties:{" + format_parameters(*props, dialect) + "},";
    }
    if (auto* r = lookup(params, "required"); truthy(r)) out += "required:[" + quoted_list(*r) + "],";
    if (auto* t = lookup(params, "type"); truthy(t))
      out += "type:" + std::string(kQuote) + python_upper(python_str(*t)) + std::string(kQuote) + "}";
  }
  return out + "}";
}

void append_system_turn(std::string& out, const ChatMessage* system, const ChatOptions& options) {
  out += "<|turn>system\n";
  if (options.enable_thinking) out += options.dialect.newline_after_think ? "<|think|>\n" : "<|think|>";
  if (system) out += python_strip(system->content);
  for (const ChatTool& tool : options.tools)
    out += "<|tool>" + std::string(python_strip(format_declaration(tool, options.dialect))) + "<tool|>";
  out += "<turn|>\n";
}

// What the last rendered message leaves open, as the templates' ns.prev_message_type.
enum class LastPart { Other, ToolCall, ToolResponse };

void append_generation_prompt(std::string& out, const ChatOptions& options, LastPart last) {
  // The later revision keeps writing in the model turn that holds calls or results.
  if (options.dialect.tool_results_in_model_turn && last != LastPart::Other) return;
  out += "<|turn>model\n";
  if (options.enable_thinking && options.dialect.open_thought_channel) out += "<|channel>thought\n";
  if (!options.enable_thinking && options.dialect.empty_thought_channel) out += "<|channel>thought\n<channel|>";
}

void append_tool_calls(std::string& out, std::span<const ChatToolCall> calls) {
  for (const ChatToolCall& call : calls) {
    out += "<|tool_call>call:" + call.name + "{";
    if (call.arguments.is_object()) {
      std::string inner = format_tool_argument(call.arguments, /*escape_keys=*/false);
      out += inner.substr(1, inner.size() - 2);  // the template writes the top-level pairs without braces
    } else if (call.arguments.is_string()) {
      out += call.arguments.get<std::string>();
    }
    out += "}<tool_call|>";
  }
}

// <|tool_response>response:NAME{value:<|"|>TEXT<|"|>}<tool_response|> for each tool message that follows the
// model message `i`, its NAME the call whose id matches (the last one), else the message's own name.
bool append_folded_tool_results(std::string& out, std::span<const ChatMessage> messages,
                                std::span<const Role> roles, size_t i) {
  bool any = false;
  for (size_t k = i + 1; k < messages.size() && roles[k] == Role::Tool; ++k) {
    const ChatMessage& result = messages[k];
    std::string name = result.name;
    for (const ChatToolCall& call : messages[i].tool_calls)
      if (call.id == result.tool_call_id) name = call.name;
    if (name.empty())
      throw Error(fmt::format("chat message {}: tool_call_id '{}' matches no call of message {} and the message has "
                              "no name; the chat template needs the function's name",
                              k, result.tool_call_id, i));
    out += "<|tool_response>response:" + name + "{value:" + format_tool_argument(result.content, true) +
           "}<tool_response|>";
    any = true;
  }
  return any;
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

std::string format_tool_argument(const nlohmann::json& value, bool escape_keys) {
  if (value.is_string()) return std::string(kQuote) + value.get<std::string>() + std::string(kQuote);
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, item] : dictsort(value)) {
      if (!first) out += ',';
      first = false;
      out += escape_keys ? std::string(kQuote) + key + std::string(kQuote) : key;
      out += ":" + format_tool_argument(*item, escape_keys);
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out.append(i ? "," : "").append(format_tool_argument(value[i], escape_keys));
    return out + "]";
  }
  return python_str(value);
}

namespace {

// The message's content as the templates write it: a string whole, a list part by part. Returns whether a media
// part came last (the templates' prev_message_type is then 'image' or 'audio').
bool append_content(std::string& out, const ChatMessage& m, bool assistant, const Gemma4ChatDialect& dialect) {
  auto text = [&](std::string_view t) { out += assistant ? strip_thinking(t) : std::string(python_strip(t)); };
  if (m.parts.empty()) {
    text(m.content);
    return false;
  }
  bool media_last = false;
  for (const ChatContentPart& part : m.parts) {
    switch (part.kind) {
      case ChatContentPart::Kind::Text: text(part.text); break;
      case ChatContentPart::Kind::Image: out += dialect.spaced_image_marker ? "\n\n<|image|>\n\n" : "<|image|>"; break;
      case ChatContentPart::Kind::Audio: out += "<|audio|>"; break;
    }
    if (part.kind != ChatContentPart::Kind::Text) media_last = true;
  }
  return media_last;
}

// One message's turn (or, continuing the model turn, its part); returns what it leaves open.
LastPart append_message(std::string& out, std::span<const ChatMessage> messages, std::span<const Role> roles, size_t i,
                        bool continues_turn, bool with_reasoning, const Gemma4ChatDialect& dialect) {
  const ChatMessage& m = messages[i];
  const bool assistant = roles[i] == Role::Assistant;
  const bool fold = dialect.tool_results_in_model_turn;
  LastPart last = LastPart::Other;
  if (!continues_turn) out += fmt::format("<|turn>{}\n", assistant ? "model" : m.role);
  if (fold && with_reasoning && !m.reasoning_content.empty() && !m.tool_calls.empty())
    out += "<|channel>thought\n" + m.reasoning_content + "\n<channel|>";
  if (!m.tool_calls.empty()) {
    append_tool_calls(out, m.tool_calls);
    last = LastPart::ToolCall;
  }
  const bool results = fold && !m.tool_calls.empty() && append_folded_tool_results(out, messages, roles, i);
  if (results) last = LastPart::ToolResponse;
  // Earlier model turns lose their thinking, as the templates' strip_thinking does.
  if (append_content(out, m, assistant, dialect)) last = LastPart::Other;
  const bool no_content = m.content.empty() && m.parts.empty();
  if (fold && last == LastPart::ToolCall) out += "<|tool_response>";  // calls awaiting their results
  else if (!(results && no_content)) out += "<turn|>\n";             // results without text keep the turn open
  return last;
}

}  // namespace

std::string render_gemma4_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  // The templates read messages[0] unconditionally; jinja2 fails on an empty list, and so do we, clearly.
  if (messages.empty()) throw Error("chat messages: the conversation is empty; expected at least one message");
  std::vector<Role> roles;
  roles.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) roles.push_back(parse_role(messages[i].role, i));
  const Gemma4ChatDialect& dialect = options.dialect;

  std::string out = options.bos_token;
  // Only a leading system/developer message goes into the system turn; a later one gets a turn of its own.
  size_t first = is_system_like(roles[0]) ? 1 : 0;
  if (options.enable_thinking || !options.tools.empty() || first == 1)
    append_system_turn(out, first ? &messages[0] : nullptr, options);

  // The later revision renders reasoning only for model messages after the last user message.
  std::optional<size_t> last_user;
  for (size_t i = first; i < messages.size(); ++i)
    if (roles[i] == Role::User) last_user = i;

  LastPart last = LastPart::Other;
  std::optional<Role> previous;  // the previous message rendered (tool results folded into a model turn are not)
  for (size_t i = first; i < messages.size(); ++i) {
    if (dialect.tool_results_in_model_turn && roles[i] == Role::Tool) continue;
    const bool continues_turn =
        dialect.merge_adjacent_assistant && roles[i] == Role::Assistant && previous == Role::Assistant;
    last = append_message(out, messages, roles, i, continues_turn, !last_user || i > *last_user, dialect);
    previous = roles[i];
  }
  if (options.add_generation_prompt) append_generation_prompt(out, options, last);
  return out;
}

Gemma4ChatDialect gemma4_chat_dialect_from_template(std::string_view jinja_text) {
  Gemma4ChatDialect dialect;
  dialect.newline_after_think = contains(jinja_text, R"(<|think|>\n)");
  // Named after the variable the revisions that merge adjacent assistant messages use for it.
  dialect.merge_adjacent_assistant = contains(jinja_text, "continue_same_model_turn");
  dialect.has_thinking_switch = contains(jinja_text, "enable_thinking");
  // The revision that folds results into the model turn looks each one's function up by its tool_call_id.
  dialect.tool_results_in_model_turn = contains(jinja_text, "tool_call_id");
  // Only the early layout writes the comma of `,properties:{` literally.
  dialect.early_parameter_layout = contains(jinja_text, ",properties:{");
  dialect.spaced_image_marker = contains(jinja_text, R"(\n\n<|image|>\n\n)");
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
