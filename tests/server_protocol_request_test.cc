// What every OpenAI endpoint's request shares, without a socket: the body's JSON (bad or too deep is a 400), the
// model field picking a LoRA adapter, the OpenAI-shaped error body, and request ids.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/lora_adapter.h"
#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

// A request's model picks a served LoRA adapter (docs/lora.md): every choice runs on it and the answer names it; the
// base's name picks none; with adapters served, another name is vLLM's 404.
TEST(ServerProtocol, ModelFieldPicksTheLoraAdapter) {
  ServedModel m = test_model();
  m.strict_name = true;
  auto adapter = std::make_shared<const LoraAdapter>();
  m.find_adapter = [&](const std::string& name) { return name == "tuned" ? adapter : nullptr; };
  const CompletionRequest tuned = parse_completion_request(completion_body({{"model", "tuned"}, {"n", 2}}), m);
  EXPECT_EQ(answered_model(tuned, m), "tuned");
  ASSERT_EQ(tuned.choices.size(), 2u);
  for (const EngineRequest& e : tuned.choices) EXPECT_EQ(e.lora, adapter);
  const CompletionRequest base = parse_completion_request(completion_body(), m);
  EXPECT_EQ(answered_model(base, m), "tiny-test");
  EXPECT_EQ(base.choices.at(0).lora, nullptr);
  try {
    parse_completion_request(completion_body({{"model", "tuned2"}}), m);
    ADD_FAILURE() << "an unknown adapter name was served";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
  }
}

TEST(ServerProtocol, ErrorBodyIsOpenAiShaped) {
  ServedModel m = test_model();
  try {
    parse_chat_request(chat_body({{"top_p", 7}}), m);
    FAIL() << "accepted top_p 7";
  } catch (const ApiError& e) {
    ojson body = error_body(e);
    ASSERT_TRUE(body.contains("error"));
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["param"], "top_p");
    EXPECT_TRUE(body["error"]["code"].is_null());
    EXPECT_NE(body["error"]["message"].get<std::string>().find("top_p"), std::string::npos);
    EXPECT_EQ(std::vector<std::string>({"message", "type", "param", "code"}),
              [&] {
                std::vector<std::string> keys;
                for (auto& [k, v] : body["error"].items()) keys.push_back(k);
                return keys;
              }());
  }
  EXPECT_TRUE(error_body("x", "server_error")["error"]["param"].is_null());
}

TEST(ServerProtocol, BadJsonIs400) {
  // 1e999: nlohmann throws out_of_range, not parse_error (found by fuzz/openai_request_fuzz; it was a 500).
  for (const char* text : {"{", "", "[1, 2]", "\"text\"", "{\"a\": }", "{\"tokens\": [1e999]}"}) {
    try {
      parse_json_body(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
    }
  }
  EXPECT_EQ(parse_json_body(R"({"a": 1})")["a"], 1);
}

// Nesting deep enough to overflow the stack of the recursive readers after the parser (400 KB of nested tool
// parameters did) is refused while parsing: in the body, and in a tool call's arguments string.
TEST(ServerProtocol, DeepJsonIs400) {
  auto nested = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  EXPECT_NO_THROW(parse_json_body("{\"a\": " + nested(127) + "}"));
  for (int levels : {128, 200000}) {
    try {
      parse_json_body("{\"a\": " + nested(levels) + "}");
      ADD_FAILURE() << levels << " levels accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("nests more than 128 levels deep"), std::string::npos) << e.what();
    }
  }
  json call = {{"id", "1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", nested(200000)}}}};
  json messages = json::array({{{"role", "assistant"}, {"tool_calls", json::array({call})}}});
  try {
    std::vector<media::MediaInput> media;
    parse_chat_messages(messages, {}, media);
    ADD_FAILURE() << "deep arguments accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages");
    EXPECT_NE(std::string(e.what()).find("messages[0].tool_calls[0].function.arguments nests more than"),
              std::string::npos)
        << e.what();
  }
}

TEST(ServerProtocol, RequestIds) {
  std::string a = new_request_id(ApiKind::Chat), b = new_request_id(ApiKind::Chat);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(new_request_id(ApiKind::Completion).rfind("cmpl-", 0), 0u);
}

}  // namespace
