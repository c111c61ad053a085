// Tools, tool_choice, response_format and reasoning in chat requests and responses: refusals name the field,
// tool_choice and response_format become the engine's constraint, tool calls and reasoning parsed out of the
// generated text, whole and streamed.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

json weather_tool(std::string name = "get_weather") {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"description", "Weather"},
            {"parameters",
             {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};
}

json tools_body(json extra = json::object()) {
  json body = chat_body({{"tools", json::array({weather_tool(), weather_tool("get_time")})}});
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

TEST(ServerTools, ToolErrorsNameTheField) {
  ServedModel m = test_model();
  const json tool_without_name = {{"type", "function"}, {"function", {{"description", "x"}}}};
  const json tool_bad_params = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "array"}}}}}};
  const json tool_params_not_object = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}};
  const std::vector<std::pair<json, std::string>> cases = {
      {tools_body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}), "tool_choice"},
      {tools_body({{"tool_choice", "sometimes"}}), "tool_choice"},
      {chat_body({{"tool_choice", "required"}}), "tool_choice"},
      {chat_body({{"tools", json::array({tool_without_name})}}), "tools"},
      {chat_body({{"tools", json::array({tool_bad_params})}}), "tools"},
      {chat_body({{"tools", json::array({tool_params_not_object})}}), "tools"},
      {chat_body({{"tools", json::array({weather_tool(), weather_tool()})}}), "tools"},
      {chat_body({{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                            {{"role", "tool"}, {"content", "result"}}})}}),
       "messages"},
      {chat_body({{"messages", json::array({{{"role", "assistant"},
                                             {"tool_calls", json::array({{{"id", "1"},
                                                                          {"function", {{"name", "f"},
                                                                                        {"arguments", "{bad"}}}}})}}})}}),
       "messages"},
      {chat_body({{"response_format", {{"type", "yaml"}}}}), "response_format"},
      {chat_body({{"response_format", {{"type", "json_schema"}}}}), "response_format"},
      {tools_body({{"parallel_tool_calls", "yes"}}), "parallel_tool_calls"},
      {chat_body({{"reasoning_effort", 3}}), "reasoning_effort"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(rejected_param(body, ApiKind::Chat, m), param) << body.dump();
}

TEST(ServerTools, ToolChoiceFillsTheConstraint) {
  ServedModel m = test_model();
  CompletionRequest automatic = parse_chat_request(tools_body(), m);
  const ConstraintSpec& a = automatic.choices[0].constraint;  // free text; a call the model opens is held
  EXPECT_EQ(a.kind, ConstraintSpec::Kind::ToolCalls);
  EXPECT_EQ(a.start, ConstraintSpec::Start::AtToolCall);
  EXPECT_EQ(a.tools.size(), 2u);
  m.tool_call_grammar = false;  // serve --no-tool-call-grammar
  EXPECT_FALSE(parse_chat_request(tools_body(), m).choices[0].constraint.active());
  m.tool_call_grammar = true;
  EXPECT_TRUE(automatic.parsing.enabled && automatic.parsing.tool_calls);
  EXPECT_TRUE(automatic.choices[0].keep_chat_markers);  // the parser reads the markers

  CompletionRequest none = parse_chat_request(tools_body({{"tool_choice", "none"}}), m);
  EXPECT_FALSE(none.choices[0].constraint.active());  // no calls: nothing to hold
  EXPECT_FALSE(none.parsing.tool_calls);
  EXPECT_EQ(none.prompt_tokens, automatic.prompt_tokens);  // tools are still declared

  CompletionRequest required = parse_chat_request(tools_body({{"tool_choice", "required"}}), m);
  const ConstraintSpec& r = required.choices[0].constraint;
  EXPECT_EQ(r.kind, ConstraintSpec::Kind::ToolCalls);
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].parameters.at("required"), json::array({"city"}));
  EXPECT_TRUE(r.parallel_calls);
  EXPECT_EQ(r.start, ConstraintSpec::Start::Now);

  CompletionRequest named = parse_chat_request(
      tools_body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                  {"parallel_tool_calls", false},
                  {"chat_template_kwargs", {{"enable_thinking", true}}}}),
      m);
  const ConstraintSpec& n = named.choices[0].constraint;
  EXPECT_EQ(n.kind, ConstraintSpec::Kind::ToolCalls);
  ASSERT_EQ(n.tools.size(), 1u);
  EXPECT_EQ(n.tools[0].name, "get_time");
  EXPECT_FALSE(n.parallel_calls);
  EXPECT_EQ(n.start, ConstraintSpec::Start::AfterThinking);
}

TEST(ServerTools, ResponseFormatFillsTheConstraint) {
  ServedModel m = test_model();
  EXPECT_FALSE(parse_chat_request(chat_body({{"response_format", {{"type", "text"}}}}), m).choices[0].constraint.active());
  EXPECT_EQ(parse_chat_request(chat_body({{"response_format", {{"type", "json_object"}}}}), m).choices[0].constraint.kind,
            ConstraintSpec::Kind::JsonObject);
  json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  CompletionRequest js = parse_chat_request(
      chat_body({{"n", 2},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}, {"strict", true}}}}},
                 {"reasoning_effort", "low"}}),
      m);
  for (const EngineRequest& e : js.choices) {
    EXPECT_EQ(e.constraint.kind, ConstraintSpec::Kind::JsonSchema);
    EXPECT_EQ(json(e.constraint.schema), schema);
    EXPECT_TRUE(e.constraint.strict);
    EXPECT_EQ(e.constraint.start, ConstraintSpec::Start::AfterThinking);
  }
  EXPECT_EQ(rejected_param(completion_body({{"response_format", {{"type", "json_object"}}}}), ApiKind::Completion, m),
            "response_format");
}

// An agent with tools and a structured answer (the openai-agents SDK's output_type) sends both: under tool_choice
// auto the output is the JSON or calls to the tools; tool_choice none keeps the JSON alone, a forced call wins.
TEST(ServerTools, ResponseFormatBesideToolsAllowsCalls) {
  ServedModel m = test_model();
  const json format = {{"type", "json_object"}};
  const ConstraintSpec automatic =
      parse_chat_request(tools_body({{"response_format", format}, {"parallel_tool_calls", false}}), m).choices[0].constraint;
  EXPECT_EQ(automatic.kind, ConstraintSpec::Kind::JsonObject);
  ASSERT_EQ(automatic.tools.size(), 2u);
  EXPECT_FALSE(automatic.parallel_calls);
  const ConstraintSpec none =
      parse_chat_request(tools_body({{"response_format", format}, {"tool_choice", "none"}}), m).choices[0].constraint;
  EXPECT_EQ(none.kind, ConstraintSpec::Kind::JsonObject);
  EXPECT_TRUE(none.tools.empty());
  const ConstraintSpec required =
      parse_chat_request(tools_body({{"response_format", format}, {"tool_choice", "required"}}), m).choices[0].constraint;
  EXPECT_EQ(required.kind, ConstraintSpec::Kind::ToolCalls);
}

TEST(ServerTools, ThinkingSwitches) {
  ServedModel m = test_model();
  EXPECT_FALSE(parse_chat_request(chat_body(), m).parsing.enabled);
  EXPECT_FALSE(parse_chat_request(chat_body(), m).choices[0].keep_chat_markers);
  EXPECT_TRUE(parse_chat_request(chat_body({{"reasoning_effort", "high"}}), m).parsing.reasoning);
  EXPECT_FALSE(parse_chat_request(chat_body({{"reasoning_effort", "none"}}), m).parsing.reasoning);
  EXPECT_TRUE(parse_chat_request(chat_body({{"chat_template_kwargs", {{"enable_thinking", true}}}}), m).parsing.reasoning);
  // The later template opens the thought channel in the prompt: the output starts inside it.
  m.dialect.open_thought_channel = true;
  EXPECT_TRUE(parse_chat_request(chat_body({{"reasoning_effort", "high"}}), m).parsing.starts_in_thought);
  EXPECT_FALSE(parse_chat_request(tools_body(), m).parsing.starts_in_thought);
}

TEST(ServerTools, HistoryWithToolCallsRenders) {
  ServedModel m = test_model();
  json messages = json::array(
      {{{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}});
  std::vector<media::MediaInput> media;
  std::string text = chat_prompt_text(parse_chat_messages(messages, {}, media), m, true, false,
                                      parse_tools(json::array({weather_tool()})));
  EXPECT_NE(text.find("<|tool>declaration:get_weather{"), std::string::npos) << text;
  EXPECT_NE(text.find("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"), std::string::npos) << text;
  EXPECT_NE(text.find("<|turn>tool\nsunny<turn|>"), std::string::npos) << text;  // the early dialect's tool turn
}

ChoiceResult finished(std::string text, std::string reason = "stop") {
  ChoiceResult c;
  c.text = std::move(text);
  c.finish_reason = std::move(reason);
  c.completion_tokens = 3;
  return c;
}

TEST(ServerTools, ResponsesCarryToolCallsAndReasoning) {
  ServedModel m = test_model();
  CompletionRequest req = parse_chat_request(tools_body({{"reasoning_effort", "medium"}}), m);
  std::vector<ChoiceResult> results = {
      finished("<|channel>thought\nhmm<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
               "<|tool_call>call:get_time{}<tool_call|>"),
      finished("Plain <|tool_call>call:broken{<tool_call|> answer"),
  };
  ojson r = completion_response(req, m, "chatcmpl-1", 1, results);
  const ojson& calls_msg = r["choices"][0]["message"];
  EXPECT_TRUE(calls_msg["content"].is_null());
  EXPECT_EQ(calls_msg["reasoning_content"], "hmm");
  ASSERT_EQ(calls_msg["tool_calls"].size(), 2u);
  const ojson& c0 = calls_msg["tool_calls"][0];
  EXPECT_EQ(c0["type"], "function");
  EXPECT_EQ(c0["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(c0["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c0["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_NE(c0["id"], calls_msg["tool_calls"][1]["id"]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  // A malformed call is content, and no call was made.
  const ojson& text_msg = r["choices"][1]["message"];
  EXPECT_EQ(text_msg["content"], "Plain call:broken{ answer");
  EXPECT_FALSE(text_msg.contains("tool_calls"));
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");

  // Thinking off: no reasoning_content; without tools or thinking the text is as generated.
  CompletionRequest plain_tools = parse_chat_request(tools_body(), m);
  ojson p = completion_response(plain_tools, m, "chatcmpl-2", 1, std::span(results).first(1));
  EXPECT_FALSE(p["choices"][0]["message"].contains("reasoning_content"));
}

TEST(ServerTools, StreamedToolCallsAndReasoning) {
  ServedModel m = test_model();
  CompletionRequest req = parse_chat_request(
      tools_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}, {"reasoning_effort", "high"}}), m);
  SseStream s(req, m, "chatcmpl-3", 1);
  frames(s.start());
  std::string text =
      "<|channel>thought\nI need <weather>.<channel|>OK<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}"
      "<tool_call|><|tool_call>call:get_time{}<tool_call|>";
  std::string reasoning, content;
  std::vector<json> calls;
  std::string finish;
  for (size_t i = 0; i < text.size(); i += 5) {
    bool last = i + 5 >= text.size();
    for (const json& f : frames(s.event(0, event(text.substr(i, 5), {token(70, NAN)}, last ? "stop" : "", 0)))) {
      const json& choice = f["choices"][0];
      const json& delta = choice["delta"];
      if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
      if (delta.contains("content")) content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls"))
        for (const json& c : delta["tool_calls"]) calls.push_back(c);
      if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
  }
  EXPECT_EQ(reasoning, "I need <weather>.");
  EXPECT_EQ(content, "OK");
  ASSERT_EQ(calls.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(calls[i]["index"], i);
    EXPECT_EQ(calls[i]["type"], "function");
    EXPECT_EQ(calls[i]["id"].get<std::string>().rfind("call_", 0), 0u);
  }
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json({{"city", "Oslo"}}));
  EXPECT_EQ(finish, "tool_calls");
  std::vector<json> tail = frames(s.finish());
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_TRUE(tail[0]["usage"].is_object());
}

}  // namespace
