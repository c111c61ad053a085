// libFuzzer target: arbitrary bytes as the text a model generated. ModelOutputSplitter never throws, and what it
// reads does not depend on how the text arrives: the first byte chooses a chunk size, and the chunked reading must
// equal the reading of the whole text at once. Content holds no marker the text did not spell across a removed
// one (plain `<|"` + marker + `|>` reads as `<|"|>`: text already streamed cannot be taken back).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/tool_calls.h"

namespace {

qs::OutputDelta read_all(std::string_view text, size_t chunk, bool in_thought) {
  qs::ModelOutputSplitter splitter(in_thought);
  qs::OutputDelta all;
  for (size_t i = 0; i < text.size(); i += chunk) all.append(splitter.push(text.substr(i, chunk)));
  all.append(splitter.finish());
  return all;
}

bool holds_marker(std::string_view text) {
  for (std::string_view m : qs::gemma4_chat_markers())
    if (text.find(m) != std::string_view::npos) return true;
  return false;
}

// `text` with every marker removed, as the splitter removes them from content.
std::string without_markers(std::string_view text) {
  std::string out(text);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::string_view m : qs::gemma4_chat_markers())
      for (size_t at; (at = out.find(m)) != std::string::npos; changed = true) out.erase(at, m.size());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 16;
  const bool in_thought = data[0] & 0x80;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  qs::OutputDelta whole = read_all(text, text.size() + 1, in_thought);
  qs::OutputDelta pieces = read_all(text, chunk, in_thought);
  if (whole.content != pieces.content || whole.reasoning != pieces.reasoning) std::abort();
  if (whole.calls.size() != pieces.calls.size()) std::abort();
  for (size_t i = 0; i < whole.calls.size(); ++i)
    if (whole.calls[i].name != pieces.calls[i].name || whole.calls[i].arguments != pieces.calls[i].arguments)
      std::abort();
  // A marker in what was read must come from markers spelled across removed ones.
  if ((holds_marker(whole.content) || holds_marker(whole.reasoning)) && without_markers(text).size() == text.size())
    std::abort();
  return 0;
}
