#include "text/tool_calls.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace qs {
namespace {

constexpr std::string_view kQuote = "<|\"|>";
constexpr std::string_view kCallOpen = "<|tool_call>";
constexpr std::string_view kCallClose = "<tool_call|>";
constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kThoughtName = "thought\n";

// Every marker the templates write; none of them reaches content or reasoning.
constexpr std::array<std::string_view, 12> kMarkers = {
    kChannelOpen, kChannelClose, kCallOpen, kCallClose,   "<|think|>", "<|tool>",
    "<tool|>",    "<|tool_response>", "<tool_response|>", "<|turn>",   "<turn|>", kQuote};

// A recursive-descent reader of format_argument's syntax. Every method returns false on anything else.
class ArgumentReader {
 public:
  explicit ArgumentReader(std::string_view text) : rest_(text) {}

  bool at_end() { return skip_space(), rest_.empty(); }

  // key:value,key:value (the inside of the braces)
  bool pairs(nlohmann::json& object, char close) {
    object = nlohmann::json::object();
    if (peek(close)) return true;
    do {
      std::string key;
      if (!read_key(key) || !literal(":")) return false;
      nlohmann::json value;
      if (!read_value(value)) return false;
      object[key] = std::move(value);
    } while (literal(","));
    return true;
  }

  bool literal(std::string_view s) {
    skip_space();
    if (!rest_.starts_with(s)) return false;
    rest_.remove_prefix(s.size());
    return true;
  }

  // The call's name: everything up to its `{`.
  bool name(std::string& out) {
    size_t brace = rest_.find('{');
    if (brace == 0 || brace == std::string_view::npos) return false;
    out = rest_.substr(0, brace);
    rest_.remove_prefix(brace);
    return out.find_first_of(" \t\n\r<>") == std::string::npos;
  }

 private:
  void skip_space() {
    while (!rest_.empty() && std::isspace(static_cast<unsigned char>(rest_.front()))) rest_.remove_prefix(1);
  }

  bool peek(char c) {
    skip_space();
    return !rest_.empty() && rest_.front() == c;
  }

  bool read_quoted(std::string& out) {
    if (!literal(kQuote)) return false;
    size_t end = rest_.find(kQuote);
    if (end == std::string_view::npos) return false;
    out = rest_.substr(0, end);
    rest_.remove_prefix(end + kQuote.size());
    return true;
  }

  // A bare key (escape_keys=False) runs to its colon; a quoted one is a string.
  bool read_key(std::string& key) {
    skip_space();
    if (rest_.starts_with(kQuote)) return read_quoted(key);
    size_t colon = rest_.find(':');
    if (colon == 0 || colon == std::string_view::npos) return false;
    key = rest_.substr(0, colon);
    rest_.remove_prefix(colon);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    return key.find_first_of(",{}[]<>\"") == std::string::npos;
  }

  bool read_value(nlohmann::json& value) {
    skip_space();
    if (rest_.starts_with(kQuote)) {
      std::string s;
      if (!read_quoted(s)) return false;
      value = std::move(s);
      return true;
    }
    if (literal("{")) return pairs(value, '}') && literal("}");
    if (literal("[")) return items(value) && literal("]");
    for (auto [word, v] : {std::pair<std::string_view, nlohmann::json>{"true", true}, {"false", false},
                           {"None", nullptr}, {"null", nullptr}})
      if (literal(word)) return value = v, true;
    return number(value);
  }

  bool items(nlohmann::json& array) {
    array = nlohmann::json::array();
    if (peek(']')) return true;
    do {
      nlohmann::json v;
      if (!read_value(v)) return false;
      array.push_back(std::move(v));
    } while (literal(","));
    return true;
  }

  // A JSON number; Python prints ints and floats (repr) within that grammar.
  bool number(nlohmann::json& value) {
    size_t n = 0;
    while (n < rest_.size() && (std::isdigit(static_cast<unsigned char>(rest_[n])) || rest_[n] == '-' ||
                                rest_[n] == '+' || rest_[n] == '.' || rest_[n] == 'e' || rest_[n] == 'E'))
      ++n;
    if (n == 0) return false;
    value = nlohmann::json::parse(rest_.substr(0, n), nullptr, /*allow_exceptions=*/false);
    if (!value.is_number()) return false;
    rest_.remove_prefix(n);
    return true;
  }

  std::string_view rest_;
};

// A call that is not read back becomes content: its text, without the markers it holds.
std::string without_markers(std::string_view text) {
  std::string out;
  while (!text.empty()) {
    size_t lt = text.find('<');
    out += text.substr(0, lt);
    if (lt == std::string_view::npos) break;
    text.remove_prefix(lt);
    auto marker = std::find_if(kMarkers.begin(), kMarkers.end(), [&](std::string_view m) { return text.starts_with(m); });
    size_t skip = marker == kMarkers.end() ? 1 : marker->size();
    if (marker == kMarkers.end()) out += '<';
    text.remove_prefix(skip);
  }
  return out;
}

// The length of the longest end of `text` that is the start of some marker (held back until the next chunk).
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  return 0;
}

}  // namespace

std::span<const std::string_view> gemma4_chat_markers() { return kMarkers; }

std::optional<ParsedToolCall> parse_tool_call(std::string_view body) {
  ArgumentReader reader(body);
  ParsedToolCall call;
  if (!reader.literal("call:") || !reader.name(call.name) || !reader.literal("{") ||
      !reader.pairs(call.arguments, '}') || !reader.literal("}") || !reader.at_end())
    return std::nullopt;
  return call;
}

std::vector<ParsedToolCall> parse_tool_calls(std::string_view text) {
  ModelOutputSplitter splitter;
  OutputDelta all = splitter.push(text);
  all.append(splitter.finish());
  return all.calls;
}

void OutputDelta::append(OutputDelta&& more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ParsedToolCall& call : more.calls) calls.push_back(std::move(call));
}

ModelOutputSplitter::ModelOutputSplitter(bool in_thought_channel, bool read_calls)
    : state_(in_thought_channel ? State::Reasoning : State::Content), read_calls_(read_calls) {}

OutputDelta ModelOutputSplitter::push(std::string_view text) {
  pending_ += text;
  OutputDelta out;
  step(out, /*final=*/false);
  return out;
}

OutputDelta ModelOutputSplitter::finish() {
  OutputDelta out;
  step(out, /*final=*/true);
  if (state_ == State::ToolCall) out.content += without_markers(call_);  // never closed: its text is content
  call_.clear();
  state_ = State::Content;
  return out;
}

void ModelOutputSplitter::emit(OutputDelta& out, std::string_view text) {
  (state_ == State::Reasoning ? out.reasoning : out.content) += text;
}

void ModelOutputSplitter::step(OutputDelta& out, bool final) {
  std::string_view rest = pending_;
  while (!rest.empty()) {
    if (state_ == State::ToolCall) {
      size_t close = rest.find(kCallClose);
      if (close == std::string_view::npos) {
        size_t hold = final ? 0 : partial_marker_suffix(rest, kCallClose);
        call_ += rest.substr(0, rest.size() - hold);
        rest.remove_prefix(rest.size() - hold);
        break;
      }
      call_ += rest.substr(0, close);
      rest.remove_prefix(close + kCallClose.size());
      auto call = read_calls_ ? parse_tool_call(call_) : std::nullopt;
      if (call) out.calls.push_back(std::move(*call));
      else out.content += without_markers(call_);  // malformed (or not read): its text is content
      call_.clear();
      state_ = State::Content;
      continue;
    }
    if (state_ == State::ChannelName) {
      // The channel's name line (`thought\n`) is not part of the reasoning.
      if (rest.starts_with(kThoughtName)) rest.remove_prefix(kThoughtName.size());
      else if (kThoughtName.starts_with(rest) && !final) break;
      state_ = State::Reasoning;
      continue;
    }
    size_t lt = rest.find('<');
    emit(out, rest.substr(0, lt));
    if (lt == std::string_view::npos) {
      rest = {};
      break;
    }
    rest.remove_prefix(lt);
    std::string_view marker;
    bool partial = false;
    for (std::string_view m : kMarkers) {
      if (rest.starts_with(m)) marker = m;
      else if (m.starts_with(rest)) partial = true;
    }
    if (marker.empty() && partial && !final) break;  // wait for the rest of a possible marker
    if (marker.empty()) {
      emit(out, "<");
      rest.remove_prefix(1);
      continue;
    }
    rest.remove_prefix(marker.size());
    if (state_ == State::Reasoning) {
      if (marker == kChannelClose) state_ = State::Content;
    } else if (marker == kChannelOpen) {
      state_ = State::ChannelName;
    } else if (marker == kCallOpen) {
      state_ = State::ToolCall;
    }
  }
  pending_ = std::string(rest);
}

}  // namespace qs
