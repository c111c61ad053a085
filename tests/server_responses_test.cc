// POST /v1/responses without a socket: a Responses body becomes the same engine request as its Chat Completions
// equivalent, errors name the Responses field, the accumulator builds items and events from synthetic engine events,
// the store's bounds, and the routes of stored responses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_responses.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/routes.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/file.h"

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace qs;

const Tokenizer& demo_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/tokenizer.json");
  return tokenizer;
}

// The demo tokenizer with the demo's early template, or the later 31B revision (tool results in the model turn).
ServedModel demo_model(bool later_template = false) {
  ServedModel m;
  m.name = "demo";
  m.tokenizer = &demo_tokenizer();
  m.generation = gemma4_release_generation_config();
  const char* templ =
      later_template ? QATSERVE_SOURCE_DIR "/tests/data/gemma4-tokenizer/google-gemma-4-31B-it.from-llamacpp-fork.jinja"
                     : QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/chat_template.jinja";
  m.dialect = gemma4_chat_dialect_from_template(read_file(templ));
  m.max_context = 4096;
  m.vocab_size = static_cast<int64_t>(demo_tokenizer().vocab_size());
  return m;
}

const json kWeatherParameters = {{"type", "object"},
                                 {"properties", {{"city", {{"type", "string"}}}}},
                                 {"required", {"city"}}};

// A tool round trip with reasoning, written as Responses items ...
json responses_body() {
  return {{"model", "demo"},
          {"instructions", "You are an agent."},
          {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather of a city."},
                      {"parameters", kWeatherParameters}, {"strict", true}}}},
          {"reasoning", {{"effort", "high"}}},
          {"input",
           {{{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()},
             {"content", {{{"type", "reasoning_text"}, {"text", "I should call the tool."}}}}},
            {{"type", "function_call"}, {"id", "fc_1"}, {"call_id", "call_1"}, {"name", "get_weather"},
             {"arguments", "{\"city\": \"Paris\"}"}, {"status", "completed"}},
            {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny, 21 C"}},
            {{"type", "message"}, {"role", "assistant"},
             {"content", {{{"type", "output_text"}, {"text", "It is sunny."}, {"annotations", json::array()}}}}},
            {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Thanks!"}}}}}}},
          {"max_output_tokens", 64},
          {"temperature", 0}};
}

// ... and as the Chat Completions request a chat client would send for it.
json chat_body() {
  return {{"model", "demo"},
          {"messages",
           {{{"role", "system"}, {"content", "You are an agent."}},
            {{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"}, {"content", nullptr}, {"reasoning_content", "I should call the tool."},
             {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                              {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
            {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny, 21 C"}},
            {{"role", "assistant"}, {"content", "It is sunny."}},
            {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Thanks!"}}}}}}},
          {"tools", {{{"type", "function"},
                      {"function", {{"name", "get_weather"}, {"description", "Weather of a city."},
                                    {"parameters", kWeatherParameters}}}}}},
          {"reasoning_effort", "high"},
          {"max_completion_tokens", 64},
          {"temperature", 0}};
}

TEST(Responses, SamePromptAndParsingAsTheChatRequest) {
  for (bool later : {false, true}) {
    const ServedModel model = demo_model(later);
    ResponseStore store(10, 1 << 20);
    ResponsesRequest r = parse_responses_request(responses_body(), model, &store);
    CompletionRequest chat = parse_chat_request(chat_body(), model);
    ASSERT_EQ(r.chat.choices.size(), 1u);
    EXPECT_EQ(r.chat.choices[0].prompt, chat.choices[0].prompt) << "later template: " << later;
    EXPECT_EQ(r.chat.prompt_tokens, chat.prompt_tokens);
    EXPECT_EQ(r.chat.choices[0].max_tokens, 64);
    EXPECT_TRUE(r.chat.parsing.reasoning && r.chat.parsing.tool_calls);
    EXPECT_EQ(r.chat.parsing.starts_in_thought, chat.parsing.starts_in_thought);
    EXPECT_EQ(r.conversation.size(), responses_body()["input"].size());
    EXPECT_EQ(r.echo["instructions"], "You are an agent.");
    EXPECT_EQ(r.echo["tools"], responses_body()["tools"]);
  }
}

TEST(Responses, TextFormatAndToolChoiceBecomeTheChatConstraint) {
  const ServedModel model = demo_model();
  json body = {{"input", "Name a city."},
               {"text", {{"format", {{"type", "json_schema"}, {"name", "city"}, {"strict", true},
                                     {"schema", {{"type", "object"},
                                                 {"properties", {{"name", {{"type", "string"}}}}}}}}}}}};
  ResponsesRequest r = parse_responses_request(body, model, nullptr);
  EXPECT_EQ(r.chat.choices[0].constraint.kind, ConstraintSpec::Kind::JsonSchema);
  EXPECT_EQ(r.chat.choices[0].constraint.schema["properties"]["name"]["type"], "string");
  body["text"] = {{"format", {{"type", "json_object"}}}};
  EXPECT_EQ(parse_responses_request(body, model, nullptr).chat.choices[0].constraint.kind,
            ConstraintSpec::Kind::JsonObject);
  body.erase("text");
  body["tools"] = {{{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "object"}}}}};
  body["tool_choice"] = {{"type", "function"}, {"name", "f"}};
  EXPECT_EQ(parse_responses_request(body, model, nullptr).chat.choices[0].constraint.kind,
            ConstraintSpec::Kind::ToolCalls);
  body["tool_choice"] = "none";
  ResponsesRequest none = parse_responses_request(body, model, nullptr);
  EXPECT_FALSE(none.chat.parsing.tool_calls);
}

// Status and the parameter an error names, or "accepted".
std::string refusal(const json& body, ResponseStore* store = nullptr) {
  try {
    parse_responses_request(body, demo_model(), store);
    return "accepted";
  } catch (const ApiError& e) {
    return std::to_string(e.status()) + " " + e.param();
  }
}

TEST(Responses, ErrorsNameTheResponsesField) {
  auto with = [](json extra) {
    json body = {{"input", "Hi"}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  };
  EXPECT_EQ(refusal(with({})), "accepted");
  EXPECT_EQ(refusal(json::object()), "400 input");
  EXPECT_EQ(refusal(with({{"input", 3}})), "400 input");
  EXPECT_EQ(refusal(with({{"input", json::array()}})), "400 input");
  EXPECT_EQ(refusal(with({{"input", {{{"type", "item_reference"}, {"id", "x"}}}}})), "400 input");
  EXPECT_EQ(refusal(with({{"input", {{{"role", "wizard"}, {"content", "x"}}}}})), "400 input");
  EXPECT_EQ(refusal(with({{"input", {{{"role", "user"}, {"content", {{{"type", "input_file"}}}}}}}})), "400 input");
  EXPECT_EQ(refusal(with({{"input", {{{"role", "user"}, {"content", "x"}},
                                     {{"type", "function_call_output"}, {"call_id", "nope"}, {"output", "1"}}}}})),
            "400 input");
  EXPECT_EQ(refusal(with({{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"},
                                      {"arguments", "{not json"}}}}})),
            "400 input");
  EXPECT_EQ(refusal(with({{"tools", {{{"type", "web_search"}}}}})), "400 tools");
  EXPECT_EQ(refusal(with({{"tools", {{{"type", "function"}}}}})), "400 tools");
  EXPECT_EQ(refusal(with({{"tool_choice", {{"type", "mcp"}}}})), "400 tool_choice");
  EXPECT_EQ(refusal(with({{"tool_choice", "required"}})), "400 tool_choice");
  EXPECT_EQ(refusal(with({{"text", {{"format", {{"type", "yaml"}}}}}})), "400 text.format");
  EXPECT_EQ(refusal(with({{"text", {{"format", {{"type", "json_schema"}}}}}})), "400 text.format");
  EXPECT_EQ(refusal(with({{"max_output_tokens", 0}})), "400 max_output_tokens");
  EXPECT_EQ(refusal(with({{"max_output_tokens", 100000}})), "400 max_output_tokens");
  EXPECT_EQ(refusal(with({{"temperature", "hot"}})), "400 temperature");
  EXPECT_EQ(refusal(with({{"reasoning", {{"effort", 3}}}})), "400 reasoning.effort");
  EXPECT_EQ(refusal(with({{"metadata", {{"k", 1}}}})), "400 metadata");
  EXPECT_EQ(refusal(with({{"store", "yes"}})), "400 store");
  EXPECT_EQ(refusal(with({{"background", true}})), "400 background");
  EXPECT_EQ(refusal(with({{"instructions", json::array()}})), "400 instructions");
  ResponseStore store(10, 1 << 20);
  EXPECT_EQ(refusal(with({{"previous_response_id", "resp_unknown"}}), &store), "404 previous_response_id");
  try {
    parse_responses_request(with({{"max_output_tokens", 0}}), demo_model(), nullptr);
  } catch (const ApiError& e) {
    EXPECT_EQ(std::string(e.what()), "max_output_tokens must be at least 1, got 0");
  }
}

TEST(Responses, PreviousResponseContinuesTheStoredConversation) {
  const ServedModel model = demo_model();
  ResponseStore store(10, 1 << 20);
  StoredResponse first;
  first.response = {{"id", "resp_1"}, {"status", "completed"}};
  first.conversation = {{{"type", "message"}, {"role", "user"}, {"content", "Weather in Paris?"}},
                        {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"},
                         {"arguments", "{\"city\":\"Paris\"}"}}};
  store.put("resp_1", first);
  json body = {{"previous_response_id", "resp_1"},
               {"input", {{{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}}}}};
  ResponsesRequest r = parse_responses_request(body, model, &store);
  ASSERT_EQ(r.conversation.size(), 3u);
  json whole = {{"input", r.conversation}};
  EXPECT_EQ(r.chat.choices[0].prompt, parse_responses_request(whole, model, nullptr).chat.choices[0].prompt);
}

EngineEvent text_event(const std::string& text, size_t tokens, const std::string& finish = "") {
  EngineEvent e;
  e.text = text;
  e.tokens.resize(tokens);
  e.finished = !finish.empty();
  e.finish_reason = finish;
  return e;
}

std::vector<ojson> run(ResponseAccumulator& acc, const std::vector<EngineEvent>& events) {
  std::vector<ojson> out = acc.start();
  for (const EngineEvent& e : events)
    for (ojson& x : acc.event(e)) out.push_back(std::move(x));
  return out;
}

ResponsesRequest thinking_tools_request() {
  json body = {{"input", "Weather?"},
               {"reasoning", {{"effort", "medium"}}},
               {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherParameters}}}}};
  return parse_responses_request(body, demo_model(), nullptr);
}

TEST(Responses, AccumulatorBuildsItemsAndEventsFromDeltas) {
  ResponsesRequest request = thinking_tools_request();
  ResponseAccumulator acc(request, "demo", "resp_x", 7);
  // A template whose generation prompt opens the thought channel leaves the model to write only what follows.
  const std::string open = request.chat.parsing.starts_in_thought ? "" : "<|channel>thought\n";
  std::vector<ojson> events = run(acc, {text_event(open, 2), text_event("Paris", 1),
                                        text_event("?<channel|>", 2), text_event(" ", 1), text_event("Let me", 2),
                                        text_event(" see.", 2),
                                        text_event("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", 9),
                                        text_event("", 1, "stop")});
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, expected);
  const ojson& r = acc.response();
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Paris?");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], " Let me see.");  // whitespace before text is kept, as on chat
  EXPECT_EQ(r["output"][2]["name"], "get_weather");
  EXPECT_EQ(json::parse(r["output"][2]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(r["usage"]["output_tokens"], 20);
  EXPECT_EQ(r["usage"]["total_tokens"], request.chat.prompt_tokens + 20);
  EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  // The last event carries the response the body and the store render, ids included.
  EXPECT_EQ(events.back()["response"], r);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r["output"][i]["status"], "completed");
}

TEST(Responses, WhitespaceAroundCallsOpensNoMessageAndLengthIsIncomplete) {
  ResponsesRequest request = thinking_tools_request();
  ResponseAccumulator calls(request, "demo", "resp_a", 0);
  run(calls, {text_event("\n", 1), text_event("<|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>", 9),
              text_event("\n", 1, "stop")});
  ASSERT_EQ(calls.response()["output"].size(), 1u);
  EXPECT_EQ(calls.response()["output"][0]["type"], "function_call");

  ResponseAccumulator cut(request, "demo", "resp_b", 0);
  std::vector<ojson> events = run(cut, {text_event("Hello", 1), text_event(" there", 1, "length")});
  EXPECT_EQ(cut.status(), "incomplete");
  EXPECT_EQ(cut.response()["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cut.response()["output"][0]["status"], "incomplete");
  EXPECT_EQ(events.back()["type"], "response.incomplete");
}

TEST(Responses, StoreKeepsTheMostRecentlyUsedWithinBothBounds) {
  auto entry = [](size_t text_bytes) {
    StoredResponse s;
    s.response = {{"text", std::string(text_bytes, 'x')}};
    return s;
  };
  ResponseStore by_count(2, 1 << 20);
  by_count.put("a", entry(1));
  by_count.put("b", entry(1));
  ASSERT_TRUE(by_count.get("a"));  // a is now the most recent
  by_count.put("c", entry(1));
  EXPECT_TRUE(by_count.get("a") && by_count.get("c"));
  EXPECT_FALSE(by_count.get("b"));
  EXPECT_TRUE(by_count.erase("a"));
  EXPECT_FALSE(by_count.erase("a"));
  EXPECT_EQ(by_count.size(), 1u);

  ResponseStore by_bytes(100, 1000);
  for (int i = 0; i < 5; ++i) by_bytes.put(std::to_string(i), entry(300));
  EXPECT_LE(by_bytes.bytes(), 1000u);
  EXPECT_EQ(by_bytes.size(), 3u);
  EXPECT_TRUE(by_bytes.get("4") && by_bytes.get("2"));
  EXPECT_FALSE(by_bytes.get("1"));
  by_bytes.put("huge", entry(5000));  // larger than the whole bound: not kept, nothing else dropped
  EXPECT_FALSE(by_bytes.get("huge"));
  EXPECT_EQ(by_bytes.size(), 3u);
}

TEST(Responses, StoredResponseRoutes) {
  EXPECT_EQ(route_of("POST", "/v1/responses", true), Route::Responses);
  EXPECT_EQ(route_of("GET", "/v1/responses", true), Route::MethodNotAllowed);
  EXPECT_EQ(route_of("GET", "/v1/responses/resp_1", true), Route::ResponseById);
  EXPECT_EQ(route_of("DELETE", "/v1/responses/resp_1", true), Route::ResponseById);
  EXPECT_EQ(route_of("PUT", "/v1/responses/resp_1", true), Route::MethodNotAllowed);
  EXPECT_EQ(route_of("POST", "/v1/responses/resp_1/cancel", true), Route::ResponseCancel);
  EXPECT_EQ(route_of("GET", "/v1/responses/resp_1/cancel", true), Route::MethodNotAllowed);
  EXPECT_EQ(route_of("GET", "/v1/responses/", true), Route::NotFound);
  EXPECT_EQ(route_of("GET", "/v1/responses/a/b", true), Route::NotFound);
  EXPECT_EQ(response_id_of("/v1/responses/resp_1/cancel"), "resp_1");
  EXPECT_EQ(response_id_of("/v1/responses/resp_1"), "resp_1");

  ResponseStore store(10, 1 << 20);
  EXPECT_THROW(retrieve_response(store, "resp_none"), ApiError);
  store.put("resp_1", StoredResponse{{{"id", "resp_1"}, {"status", "completed"}}, json::array()});
  EXPECT_EQ(retrieve_response(store, "resp_1")["id"], "resp_1");
  try {
    cancel_response(store, "resp_1");
    ADD_FAILURE() << "a finished response was cancelled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
  EXPECT_EQ(delete_response(store, "resp_1")["deleted"], true);
  try {
    delete_response(store, "resp_1");
    ADD_FAILURE() << "deleted twice";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
  }
}

}  // namespace
