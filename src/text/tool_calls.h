#pragma once
// The model's side of Gemma 4 tool calling and thinking: what it writes after the generation prompt, read back.
//
//   <|channel>thought\nTHOUGHTS<channel|>          reasoning (the prompt may have opened the channel already)
//   <|tool_call>call:NAME{key:value,...}<tool_call|>  a call, arguments in the chat template's format_argument syntax
//   anything else                                   content
//
// parse_tool_call is the exact inverse of the template's call rendering (render_gemma4_chat / format_tool_argument):
// strings in <|"|>, true/false, None (and null), numbers, {key:value} with bare or <|"|>-quoted keys, [a,b]; ASCII
// whitespace between tokens is tolerated. ModelOutputSplitter reads generated text chunk by chunk (as the engine
// streams it, special tokens kept) and hands back reasoning, content and whole calls; a malformed or unfinished call
// comes back as content (its text without the markers), and template markers never reach content.
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

// Every marker the Gemma 4 chat templates write (<|channel>, <|tool_call>, <|"|>, <turn|>, ...): what the parser
// reads, and what never reaches content.
std::span<const std::string_view> gemma4_chat_markers();

struct ParsedToolCall {
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();
};

// The text between <|tool_call> and <tool_call|>: `call:NAME{...}`. nullopt when it is not exactly that.
std::optional<ParsedToolCall> parse_tool_call(std::string_view body);

// Every well-formed <|tool_call>...<tool_call|> in `text`, in order.
std::vector<ParsedToolCall> parse_tool_calls(std::string_view text);

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> calls;  // calls completed by this chunk

  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  void append(OutputDelta&& more);
};

class ModelOutputSplitter {
 public:
  // `in_thought_channel`: the prompt ended inside an opened `<|channel>thought\n` (the later templates with
  // thinking on), so the output starts with reasoning. `read_calls` false: calls come back as content (their
  // text without the markers), as with tool_choice none.
  explicit ModelOutputSplitter(bool in_thought_channel = false, bool read_calls = true);

  // What `text` (the next generated text) completes. A possible marker prefix at the end is held back.
  OutputDelta push(std::string_view text);
  // The end of generation: text held back is released (an unfinished call becomes content).
  OutputDelta finish();

 private:
  enum class State { Content, ChannelName, Reasoning, ToolCall };
  void step(OutputDelta& out, bool final);
  void emit(OutputDelta& out, std::string_view text);

  State state_;
  bool read_calls_;
  std::string pending_;  // text not yet classified
  std::string call_;     // the body of the call being read
};

}  // namespace qs
