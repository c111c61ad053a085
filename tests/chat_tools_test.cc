// Tools, tool calls, tool results and reasoning: the renderer against jinja2's rendering of OpenAI-format histories
// (tests/golden/chat_gemma4_tools.json, tools/python/make_chat_golden.py), and the tool-call parser and output
// splitter against the same goldens (render with jinja2 -> parse -> the calls the history holds) and against
// transformers' own Gemma 4 response parser.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"
#include "util/error.h"

namespace qs {
namespace {

using json = nlohmann::json;

const json& golden() {
  static const json g = [] {
    std::ifstream in(std::string(QATSERVE_SOURCE_DIR) + "/tests/golden/chat_gemma4_tools.json");
    return json::parse(in);
  }();
  return g;
}

// The dialects of the two templates, read from their text as the server does.
const std::map<std::string, Gemma4ChatDialect>& dialects() {
  static const std::map<std::string, Gemma4ChatDialect> d = [] {
    std::map<std::string, Gemma4ChatDialect> out;
    std::ifstream in(std::string(QATSERVE_SOURCE_DIR) + "/tests/golden/chat_gemma4.json");
    const json plain = json::parse(in);
    for (const auto& [name, t] : plain.at("templates").items())
      out[name] = gemma4_chat_dialect_from_template(t.at("text").get<std::string>());
    return out;
  }();
  return d;
}

// The golden's conversations carry images and audio; the renderer only writes their markers.
MediaOptions all_media() { return {.images = true, .audio = true}; }

std::string render_case(const json& c) {
  const json& conv = golden().at("conversations").at(c.at("conversation").get<std::string>());
  ChatOptions options;
  options.dialect = dialects().at(c.at("template"));
  options.enable_thinking = c.at("enable_thinking");
  options.add_generation_prompt = c.at("add_generation_prompt");
  if (!conv.at("tools").is_null()) options.tools = parse_tools(conv.at("tools"));
  std::vector<media::MediaInput> media;
  std::vector<ChatMessage> messages = parse_chat_messages(conv.at("messages"), all_media(), media);
  return render_gemma4_chat(messages, options);
}

// The calls of the last assistant message of a conversation, as the request sent them.
std::vector<ParsedToolCall> calls_sent(const json& messages) {
  std::vector<ParsedToolCall> out;
  for (const json& c : messages.back().at("tool_calls"))
    out.push_back({c.at("function").at("name"), json::parse(c.at("function").at("arguments").get<std::string>())});
  return out;
}

OutputDelta split_all(std::string_view text, bool in_thought = false, size_t chunk = 0) {
  ModelOutputSplitter splitter(in_thought);
  OutputDelta all;
  if (chunk == 0) chunk = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += chunk) all.append(splitter.push(text.substr(i, chunk)));
  all.append(splitter.finish());
  return all;
}

}  // namespace

// Both templates, every history, thinking on/off, generation prompt on/off: identical to jinja2, and where jinja2
// fails on a history (the template's own limits), so does the renderer, with a message.
TEST(ChatTools, MatchesJinja2GoldenOnBothTemplates) {
  ASSERT_EQ(dialects().size(), 2u);
  int rendered = 0, failed = 0;
  for (const json& c : golden().at("cases")) {
    std::string label = fmt::format("{} / {} thinking={} generation_prompt={}", c.at("template").get<std::string>(),
                                    c.at("conversation").get<std::string>(), c.at("enable_thinking").get<bool>(),
                                    c.at("add_generation_prompt").get<bool>());
    if (c.contains("error")) {
      EXPECT_THROW(render_case(c), Error) << label << ": jinja2 fails with " << c.at("error");
      ++failed;
      continue;
    }
    EXPECT_EQ(render_case(c), c.at("expected").get<std::string>()) << label;
    ++rendered;
  }
  EXPECT_GE(rendered, 200);
  EXPECT_GE(failed, 4);
}

TEST(ChatTools, DetectsToolDialects) {
  const auto& d = dialects();
  EXPECT_FALSE(d.at("gemma4_early").tool_results_in_model_turn);
  EXPECT_TRUE(d.at("gemma4_early").early_parameter_layout);
  EXPECT_TRUE(d.at("gemma4_31b_later").tool_results_in_model_turn);
  EXPECT_FALSE(d.at("gemma4_31b_later").early_parameter_layout);
}

// Round trip: the model turn jinja2 rendered from a history's calls parses back into exactly those calls.
TEST(ChatTools, ParserReadsBackTheCallsJinja2Rendered) {
  int checked = 0;
  for (const json& c : golden().at("cases")) {
    const json& messages = golden().at("conversations").at(c.at("conversation").get<std::string>()).at("messages");
    if (!messages.back().contains("tool_calls") || c.at("add_generation_prompt") || c.contains("error")) continue;
    const std::string& text = c.at("expected").get_ref<const std::string&>();
    std::string model_turn = text.substr(text.rfind("<|turn>model\n") + 13);
    std::vector<ParsedToolCall> expected = calls_sent(messages);
    for (size_t chunk : {size_t{0}, size_t{1}, size_t{7}}) {
      OutputDelta out = split_all(model_turn, false, chunk);
      ASSERT_EQ(out.calls.size(), expected.size()) << c.at("conversation") << " chunk " << chunk << ": " << model_turn;
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(out.calls[i].name, expected[i].name) << c.at("conversation");
        EXPECT_EQ(out.calls[i].arguments, expected[i].arguments) << c.at("conversation") << ": " << model_turn;
      }
      EXPECT_EQ(out.content.find("<|"), std::string::npos) << out.content;
    }
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

// The same outputs read by transformers' own Gemma 4 response parser (`transformers serve`): the same reasoning, the
// same calls, the same content once stripped (transformers strips content; the splitter streams it as written, so
// it cannot know which whitespace is the last).
TEST(ChatTools, SplitterReadsWhatTransformersParserReads) {
  const json& parses = golden().at("parses");
  ASSERT_GE(parses.size(), 10u) << "regenerate the golden with transformers importable";
  auto text_or_empty = [](const json& v) { return v.is_null() ? std::string() : v.get<std::string>(); };
  for (const json& p : parses) {
    const std::string& text = p.at("text").get_ref<const std::string&>();
    OutputDelta out = split_all(text, false, 3);
    EXPECT_EQ(out.reasoning, text_or_empty(p.at("reasoning_content"))) << text;
    EXPECT_EQ(std::string(python_strip(out.content)), text_or_empty(p.at("content"))) << text;
    ASSERT_EQ(out.calls.size(), p.at("tool_calls").size()) << text;
    for (size_t i = 0; i < out.calls.size(); ++i) {
      EXPECT_EQ(out.calls[i].name, p.at("tool_calls")[i].at("name")) << text;
      EXPECT_EQ(out.calls[i].arguments, p.at("tool_calls")[i].at("arguments")) << text;
    }
  }
}

TEST(ChatTools, FormatArgumentAsPythonPrintsIt) {
  EXPECT_EQ(format_tool_argument(json::parse(R"({"b":1,"A":[true,null,"s"],"c":{"k":0.5}})"), false),
            R"({A:[true,None,<|"|>s<|"|>],b:1,c:{k:0.5}})");
  EXPECT_EQ(format_tool_argument(json::parse(R"({"k":1})"), true), R"({<|"|>k<|"|>:1})");
  EXPECT_EQ(format_tool_argument(1e16, false), "1e+16");
  EXPECT_EQ(format_tool_argument(1e15, false), "1000000000000000.0");
  EXPECT_EQ(format_tool_argument(1e-5, false), "1e-05");
  EXPECT_EQ(format_tool_argument(0.0001, false), "0.0001");
  EXPECT_EQ(format_tool_argument(-0.0, false), "-0.0");
  EXPECT_EQ(format_tool_argument(1.5e300, false), "1.5e+300");
  EXPECT_EQ(format_tool_argument(123456.789, false), "123456.789");
}

TEST(ChatTools, MalformedCallsComeBackAsContent) {
  for (std::string body : {"call:f{a:}", "call:f{a:1", "call:{a:1}", "f{a:1}", "call:f{a:<|\"|>open}", "call:f{a:1}x",
                           "call:f{:1}", "call:f{a:1,}", "call:f{a:[1,}", "call:f{a:tru}"}) {
    EXPECT_FALSE(parse_tool_call(body).has_value()) << body;
    OutputDelta out = split_all("before <|tool_call>" + body + "<tool_call|> after");
    EXPECT_TRUE(out.calls.empty()) << body;
    std::string shown = body;  // the quote marker is a template marker: it never reaches content
    for (size_t q; (q = shown.find("<|\"|>")) != std::string::npos;) shown.erase(q, 5);
    EXPECT_EQ(out.content, "before " + shown + " after");
  }
  // An unfinished call at the end of generation (max_tokens) is content too, without the markers it holds.
  OutputDelta out = split_all("x<|tool_call>call:f{a:<|\"|>1<channel|><|tool_call> <b>");
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, "xcall:f{a:1 <b>");
}

TEST(ChatTools, SplitterSeparatesReasoningContentAndCalls) {
  const std::string text =
      "<|channel>thought\nLet me think <b>.<channel|>Sure<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
      "<tool_call|><|tool_call>call:get_time{}<tool_call|>";
  for (size_t chunk : {size_t{0}, size_t{1}, size_t{3}}) {
    OutputDelta out = split_all(text, false, chunk);
    EXPECT_EQ(out.reasoning, "Let me think <b>.");
    EXPECT_EQ(out.content, "Sure");
    ASSERT_EQ(out.calls.size(), 2u);
    EXPECT_EQ(out.calls[0].name, "get_weather");
    EXPECT_EQ(out.calls[0].arguments, json({{"city", "Paris"}}));
    EXPECT_EQ(out.calls[1].arguments, json::object());
  }
  // The prompt opened the channel: the output starts with reasoning.
  OutputDelta opened = split_all("hmm<channel|>Answer", /*in_thought=*/true);
  EXPECT_EQ(opened.reasoning, "hmm");
  EXPECT_EQ(opened.content, "Answer");
  // Markers never reach content; text that only looks like the start of one does.
  OutputDelta markers = split_all("a<|think|>b<turn|>c<|\"|>d < e <|x");
  EXPECT_EQ(markers.content, "abcd < e <|x");
}

TEST(ChatTools, ParserToleratesWhitespaceAndQuotedKeys) {
  auto call = parse_tool_call("call:f{ <|\"|>a b<|\"|> : [ 1 , 2.5 ] , c : null }");
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->arguments, json::parse(R"({"a b":[1,2.5],"c":null})"));
}

// The engine streams with the chat markers kept and every other special token skipped: the markers reach the
// splitter, <pad>/<bos>/<mask> never reach content. (The demo tokenizer has Gemma 4's control tokens and ids.)
TEST(ChatTools, StreamDecoderKeepsOnlyTheChatMarkers) {
  Tokenizer tok = Tokenizer::load(std::string(QATSERVE_SOURCE_DIR) + "/configs/demo-tokenizer/tokenizer.json");
  std::vector<int32_t> ids = {*tok.token_id("<pad>"), *tok.token_id("<|tool_call>"), *tok.token_id("<bos>")};
  auto hi = tok.encode("call:f{}");
  ids.insert(ids.end(), hi.begin(), hi.end());
  ids.push_back(*tok.token_id("<tool_call|>"));
  ids.push_back(*tok.token_id("<mask>"));
  StreamDecoder decoder(tok, /*skip_special_tokens=*/true, gemma4_chat_markers());
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  text += decoder.flush();
  EXPECT_EQ(text, "<|tool_call>call:f{}<tool_call|>");
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "call:f{}");  // without the list, as before
  ASSERT_EQ(parse_tool_calls(text).size(), 1u);
}

}  // namespace qs
