// Anthropic's Messages API without a socket or a model: the conversion of a Messages body into the Chat Completions
// body the chat parser reads, its refusals (each naming the field by Anthropic's path), and the events and message
// the assembler writes for a synthetic sequence of engine events. The end-to-end checks against the official
// `anthropic` client, jinja2 and transformers are in tests/server/test_anthropic_messages.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/anthropic_messages_request.h"
#include "server/anthropic_messages_response.h"

namespace {

using nlohmann::json;
using namespace qs;

const json kWeatherTool = {{"name", "get_weather"},
                           {"description", "Weather for a city."},
                           {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};

json agent_body() {
  return {
      {"model", "m"},
      {"max_tokens", 64},
      {"system", json::array({{{"type", "text"}, {"text", "You are an agent."}}, {{"type", "text"}, {"text", "Be brief."}}})},
      {"messages",
       json::array({
           {{"role", "user"},
            {"content", json::array({{{"type", "text"}, {"text", "Weather?"}},
                                     {{"type", "image"},
                                      {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBO"}}}}})}},
           {{"role", "assistant"},
            {"content", json::array({{{"type", "thinking"}, {"thinking", "Use the tool."}, {"signature", "s"}},
                                     {{"type", "text"}, {"text", "Checking."}},
                                     {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"},
                                      {"input", {{"city", "Paris"}}}}})}},
           {{"role", "user"},
            {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"is_error", true},
                                      {"content", json::array({{{"type", "text"}, {"text", "timeout"}}})}},
                                     {{"type", "text"}, {"text", "Try again?"}}})}},
       })},
      {"tools", json::array({kWeatherTool})},
      {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
      {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
      {"stop_sequences", json::array({"END"})},
      {"temperature", 0},
      {"top_k", 5},
      {"metadata", {{"user_id", "u"}}},
      {"stream", true},
  };
}

TEST(AnthropicMessages, ConvertsToTheEquivalentChatBody) {
  const json expected = {
      {"messages",
       json::array({
           {{"role", "system"}, {"content", "You are an agent.\nBe brief."}},
           {{"role", "user"},
            {"content", json::array({{{"type", "text"}, {"text", "Weather?"}},
                                     {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,iVBO"}}}}})}},
           {{"role", "assistant"},
            {"content", json::array({{{"type", "text"}, {"text", "Checking."}}})},
            {"reasoning_content", "Use the tool."},
            {"tool_calls", json::array({{{"id", "toolu_1"}, {"type", "function"},
                                         {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
           {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"name", "get_weather"}, {"content", "Error: timeout"}},
           {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Try again?"}}})}},
       })},
      {"model", "m"},
      {"max_tokens", 64},
      {"stream", true},
      {"stop", json::array({"END"})},
      {"temperature", 0},
      {"top_k", 5},
      {"chat_template_kwargs", {{"enable_thinking", true}}},
      {"tools", json::array({{{"type", "function"},
                              {"function", {{"name", "get_weather"}, {"description", "Weather for a city."},
                                            {"parameters", kWeatherTool["input_schema"]}}}}})},
      {"tool_choice", "required"},
      {"parallel_tool_calls", false},
  };
  EXPECT_EQ(messages_to_chat_body(agent_body(), MessagesEndpoint::Create), expected);
}

TEST(AnthropicMessages, ToolChoiceKinds) {
  json body = agent_body();
  const std::vector<std::pair<json, json>> cases = {
      {{{"type", "auto"}}, "auto"},
      {{{"type", "none"}}, "none"},
      {{{"type", "any"}}, "required"},
      {{{"type", "tool"}, {"name", "get_weather"}}, {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
  };
  for (const auto& [choice, chat] : cases) {
    body["tool_choice"] = choice;
    json converted = messages_to_chat_body(body, MessagesEndpoint::Create);
    EXPECT_EQ(converted["tool_choice"], chat) << choice;
    EXPECT_FALSE(converted.contains("parallel_tool_calls")) << choice;
  }
  for (const auto& [type, on] : std::vector<std::pair<std::string, bool>>{
           {"disabled", false}, {"adaptive", true}, {"between_tools", true}}) {
    body["thinking"] = {{"type", type}};
    EXPECT_EQ(messages_to_chat_body(body, MessagesEndpoint::Create)["chat_template_kwargs"]["enable_thinking"], on)
        << type;
  }
}

TEST(AnthropicMessages, CountTokensNeedsNoMaxTokens) {
  json body = agent_body();
  body.erase("max_tokens");
  json converted = messages_to_chat_body(body, MessagesEndpoint::CountTokens);
  EXPECT_FALSE(converted.contains("max_tokens"));
  EXPECT_FALSE(converted.contains("stream"));
  EXPECT_EQ(converted["messages"].size(), 5u);
}

// Each refusal is a 400 whose message starts with the field's path.
TEST(AnthropicMessages, BadInputNamesTheField) {
  const json user_hi = {{"role", "user"}, {"content", "hi"}};
  auto with_messages = [&](json messages) {
    json b = {{"model", "m"}, {"max_tokens", 8}, {"messages", std::move(messages)}};
    return b;
  };
  json missing_max = with_messages(json::array({user_hi}));
  missing_max.erase("max_tokens");
  json zero_max = with_messages(json::array({user_hi}));
  zero_max["max_tokens"] = 0;
  json bad_tool = with_messages(json::array({user_hi}));
  bad_tool["tools"] = json::array({{{"name", "f"}}});
  json server_tool = with_messages(json::array({user_hi}));
  server_tool["tools"] = json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}});
  json bad_choice = with_messages(json::array({user_hi}));
  bad_choice["tool_choice"] = {{"type", "sometimes"}};
  json bad_thinking = with_messages(json::array({user_hi}));
  bad_thinking["thinking"] = {{"type", "enabled"}};
  json bad_stops = with_messages(json::array({user_hi}));
  bad_stops["stop_sequences"] = json::array({"a", 3});
  const json orphan_result = {{"role", "user"},
                              {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_9"}}})}};
  const json call = {{"role", "assistant"},
                     {"content", json::array({{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "f"}, {"input", json::object()}}})}};
  const std::vector<std::pair<json, std::string>> cases = {
      {missing_max, "max_tokens: Field required"},
      {zero_max, "max_tokens: "},
      {with_messages(json::array({{{"role", "user"}, {"content", json::array({{{"type", "video"}}})}}})),
       "messages.0.content.0.type: \"video\" blocks are not supported"},
      {with_messages(json::array({orphan_result})), "messages.0.content.0.tool_use_id: unexpected tool_use_id \"toolu_9\""},
      // answered two messages later, not by the next message
      {with_messages(json::array({call, user_hi, {{"role", "assistant"}, {"content", "x"}},
                                  {{"role", "user"}, {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}}})}}})),
       "messages.3.content.0.tool_use_id: "},
      {with_messages(json::array({{{"role", "system"}, {"content", "x"}}})), "messages.0.role: "},
      {with_messages(json::array({{{"role", "user"}}})), "messages.0.content: Field required"},
      {with_messages(json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}})),
       "messages.0.content.0.text: Field required"},
      {with_messages(json::array({{{"role", "user"},
                                   {"content", json::array({{{"type", "image"}, {"source", {{"type", "file"}}}}})}}})),
       "messages.0.content.0.source.type: "},
      {with_messages(json::array({{{"role", "assistant"},
                                   {"content", json::array({{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}}})}}})),
       "messages.0.content.0.input: Field required"},
      {with_messages(json::array()), "messages: "},
      {with_messages("hi"), "messages: "},
      {bad_tool, "tools.0.input_schema: Field required"},
      {server_tool, "tools.0.type: "},
      {bad_choice, "tool_choice.type: "},
      {bad_thinking, "thinking.budget_tokens: Field required"},
      {bad_stops, "stop_sequences.1: "},
  };
  for (const auto& [body, prefix] : cases) {
    try {
      messages_to_chat_body(body, MessagesEndpoint::Create);
      ADD_FAILURE() << "accepted: " << body.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body.dump();
      EXPECT_TRUE(std::string(e.what()).starts_with(prefix)) << e.what() << "\nexpected to start with: " << prefix;
      const json error = json::parse(anthropic_error_body(e).dump());
      EXPECT_EQ(error["type"], "error");
      EXPECT_EQ(error["error"]["type"], "invalid_request_error");
      EXPECT_EQ(error["error"]["message"], e.what());
    }
  }
}

TEST(AnthropicMessages, ErrorTypesFollowTheStatus) {
  const std::vector<std::pair<int, std::string>> cases = {{401, "authentication_error"}, {404, "not_found_error"},
                                                          {413, "request_too_large"},   {429, "rate_limit_error"},
                                                          {500, "api_error"},           {503, "overloaded_error"}};
  for (const auto& [status, type] : cases)
    EXPECT_EQ(anthropic_error_body(ApiError(status, "x"))["error"]["type"], type) << status;
}

EngineEvent text_event(std::string text, int tokens = 1) {
  EngineEvent e;
  e.text = std::move(text);
  e.tokens.resize(tokens);
  return e;
}

EngineEvent last_event(std::string text, std::string reason, std::string stop_string = "") {
  EngineEvent e = text_event(std::move(text));
  e.finished = true;
  e.finish_reason = std::move(reason);
  e.stop_string = std::move(stop_string);
  return e;
}

// The server-sent events as (event name, parsed data), checking the framing.
std::vector<std::pair<std::string, json>> parse_events(const std::string& stream) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    const size_t end = stream.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << stream.substr(pos);
    if (end == std::string::npos) break;
    const std::string frame = stream.substr(pos, end - pos);
    const size_t newline = frame.find('\n');
    EXPECT_TRUE(frame.starts_with("event: ")) << frame;
    EXPECT_EQ(frame.substr(newline + 1, 6), "data: ") << frame;
    const std::string name = frame.substr(7, newline - 7);
    json data = json::parse(frame.substr(newline + 7));
    EXPECT_EQ(data["type"], name);
    out.emplace_back(name, std::move(data));
    pos = end + 2;
  }
  return out;
}

OutputParsing tools_and_thinking() {
  OutputParsing p;
  p.enabled = p.tool_calls = p.reasoning = true;
  return p;
}

TEST(AnthropicMessages, StreamFromStructuredDeltas) {
  MessageAssembler streamed(tools_and_thinking(), "msg_1", "m", 12, true);
  MessageAssembler whole(tools_and_thinking(), "msg_1", "m", 12, false);
  const std::vector<EngineEvent> events = {
      text_event("<|channel>thought\nLet"), text_event(" me see.<channel|>"), text_event("\n"), text_event("It is"),
      text_event(" sunny."), text_event("\n<|tool_call>call:get_weather{city:<|\"|>Par"),
      last_event("is<|\"|>}<tool_call|>", "stop")};
  std::string stream = streamed.start();
  EXPECT_EQ(whole.start(), "");
  for (const EngineEvent& e : events) {
    stream += streamed.event(e);
    EXPECT_EQ(whole.event(e), "");
  }
  const auto parsed = parse_events(stream);
  std::vector<std::string> names;
  for (const auto& [name, data] : parsed) names.push_back(name);
  const std::vector<std::string> expected_names = {
      "message_start",       "ping",                                                          // the message
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",  // thinking
      "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",  // text
      "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",                         // tool_use
      "message_delta",       "message_stop"};
  EXPECT_EQ(names, expected_names);
  EXPECT_EQ(parsed[0].second["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(parsed[0].second["message"]["content"], json::array());
  EXPECT_EQ(parsed[2].second["content_block"], json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
  EXPECT_EQ(parsed[3].second["delta"], json({{"type", "thinking_delta"}, {"thinking", "Let"}}));
  EXPECT_EQ(parsed[5].second["delta"]["type"], "signature_delta");
  EXPECT_EQ(parsed[5].second["delta"]["signature"], thinking_signature("Let me see."));
  EXPECT_EQ(parsed[8].second["delta"], json({{"type", "text_delta"}, {"text", "\nIt is"}}));
  EXPECT_EQ(parsed[8].second["index"], 1);
  EXPECT_EQ(parsed[10].second["delta"], json({{"type", "text_delta"}, {"text", "\n"}}));  // inside the text: kept
  EXPECT_EQ(parsed[12].second["content_block"]["input"], json::object());
  EXPECT_EQ(parsed[13].second["delta"], json({{"type", "input_json_delta"}, {"partial_json", "{\"city\":\"Paris\"}"}}));
  EXPECT_EQ(parsed[15].second["delta"], json({{"stop_reason", "tool_use"}, {"stop_sequence", nullptr}}));
  EXPECT_EQ(parsed[15].second["usage"]["output_tokens"], 7);

  const json message = json::parse(whole.message().dump());
  EXPECT_EQ(message["id"], "msg_1");
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["stop_reason"], "tool_use");
  EXPECT_EQ(message["usage"], json({{"input_tokens", 12}, {"output_tokens", 7}}));
  ASSERT_EQ(message["content"].size(), 3u);
  EXPECT_EQ(message["content"][0],
            json({{"type", "thinking"}, {"thinking", "Let me see."}, {"signature", thinking_signature("Let me see.")}}));
  EXPECT_EQ(message["content"][1], json({{"type", "text"}, {"text", "\nIt is sunny.\n"}}));
  EXPECT_EQ(message["content"][2]["type"], "tool_use");
  EXPECT_TRUE(message["content"][2]["id"].get<std::string>().starts_with("toolu_"));
  EXPECT_EQ(message["content"][2]["name"], "get_weather");
  EXPECT_EQ(message["content"][2]["input"], json({{"city", "Paris"}}));
  // The streamed message is the same but for the tool_use id, minted per request.
  const json streamed_message = json::parse(streamed.message().dump());
  json a = message, b = streamed_message;
  a["content"][2].erase("id");
  b["content"][2].erase("id");
  EXPECT_EQ(a, b);
}

TEST(AnthropicMessages, StopReasons) {
  struct Case {
    EngineEvent last;
    std::string reason;
    json stop_sequence;
  };
  const std::vector<Case> cases = {{last_event("", "stop"), "end_turn", nullptr},
                                   {last_event("x", "length"), "max_tokens", nullptr},
                                   {last_event("", "stop", "END"), "stop_sequence", "END"}};
  for (const Case& c : cases) {
    MessageAssembler a(OutputParsing{}, "msg_1", "m", 3, true);
    std::string stream = a.start();  // one statement each: the order of a + b's operands is unspecified
    stream += a.event(text_event("Hi"));
    stream += a.event(c.last);
    const auto parsed = parse_events(stream);
    ASSERT_GE(parsed.size(), 2u);
    EXPECT_EQ(parsed[parsed.size() - 2].second["delta"]["stop_reason"], c.reason);
    EXPECT_EQ(parsed[parsed.size() - 2].second["delta"]["stop_sequence"], c.stop_sequence);
    EXPECT_EQ(a.message()["stop_reason"], c.reason);
    EXPECT_EQ(a.message()["content"][0]["text"], std::string("Hi") + c.last.text);
  }
}

TEST(AnthropicMessages, FailureEndsTheStreamWithAnErrorEvent) {
  MessageAssembler a(OutputParsing{}, "msg_1", "m", 3, true);
  EngineEvent failed;
  failed.finished = true;
  failed.finish_reason = "error";
  failed.error = "out of memory";
  std::string stream = a.start();
  stream += a.event(text_event("Hi"));
  stream += a.event(failed);
  const auto parsed = parse_events(stream);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed.back().first, "error");
  EXPECT_EQ(parsed.back().second["error"], json({{"type", "api_error"}, {"message", "out of memory"}}));
  EXPECT_EQ(parsed[parsed.size() - 2].first, "content_block_stop");  // the open block was closed first
  ASSERT_TRUE(a.failure());
  EXPECT_EQ(a.failure()->status(), 500);
}

// Whitespace next to a call is no text block; a whitespace-only answer is still the answer.
TEST(AnthropicMessages, WhitespaceAroundCalls) {
  OutputParsing calls;
  calls.enabled = calls.tool_calls = true;
  MessageAssembler a(calls, "msg_1", "m", 3, false);
  a.event(text_event("\n"));
  a.event(text_event("<|tool_call>call:f{}<tool_call|>"));
  a.event(last_event("\n", "stop"));
  ASSERT_EQ(a.message()["content"].size(), 1u);
  EXPECT_EQ(a.message()["content"][0]["type"], "tool_use");
  MessageAssembler b(OutputParsing{}, "msg_1", "m", 3, false);
  b.event(last_event(" ", "stop"));
  EXPECT_EQ(b.message()["content"], nlohmann::ordered_json::parse(R"([{"type":"text","text":" "}])"));
}

}  // namespace
