// POST /v1/chat/completions' request without a socket: the prompt is the rendered chat template, sampling fields
// reach the engine request, and every bad parameter is a 400 that names it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"
#include "text/chat_template.h"

namespace {

using namespace qs;
using namespace qs::test;

TEST(ServerProtocol, ChatPromptIsTheRenderedTemplate) {
  ServedModel m = test_model();
  CompletionRequest r = parse_chat_request(chat_body(), m);
  ASSERT_EQ(r.choices.size(), 1u);
  std::vector<ChatMessage> msgs = {{"user", "Hi there"}};
  ChatOptions o;
  o.dialect = m.dialect;
  std::vector<int32_t> expected = test_tokenizer().encode(render_gemma4_chat(msgs, o));
  EXPECT_EQ(r.choices[0].prompt, expected);
  EXPECT_EQ(r.choices[0].prompt.front(), 2);  // <bos>, written by the template
  EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(expected.size()));
  // Unset: the rest of the context, and generation_config.json's sampling.
  EXPECT_EQ(r.choices[0].max_tokens, 512 - r.prompt_tokens);
  EXPECT_EQ(r.choices[0].sampling.top_k, 64);
  EXPECT_FLOAT_EQ(r.choices[0].sampling.top_p, 0.95f);
  EXPECT_FALSE(r.choices[0].sampling.seed);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.logprobs.enabled);
}

// A user turn's text parts are written one after the other, each trimmed, as the template's loop over the parts
// does (tests/golden/chat_gemma4_tools.json holds that to jinja2).
TEST(ServerProtocol, ChatTextPartsRenderAsTheTemplateDoes) {
  ServedModel m = test_model();
  json parts = chat_body();
  parts["messages"][0]["content"] = json::array({{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", " there"}}});
  json plain = chat_body();
  plain["messages"][0]["content"] = "Hithere";
  EXPECT_EQ(parse_chat_request(parts, m).choices[0].prompt, parse_chat_request(plain, m).choices[0].prompt);
  // A system turn and an assistant turn with null content render too.
  json multi = chat_body();
  multi["messages"] = json::array({{{"role", "system"}, {"content", "Be brief"}},
                                   {{"role", "user"}, {"content", "Hi"}},
                                   {{"role", "assistant"}, {"content", nullptr}},
                                   {{"role", "user"}, {"content", "again"}}});
  EXPECT_GT(parse_chat_request(multi, m).prompt_tokens, parse_chat_request(plain, m).prompt_tokens);
}

TEST(ServerProtocol, SamplingFieldsReachTheEngineRequest) {
  ServedModel m = test_model();
  CompletionRequest r = parse_chat_request(
      chat_body({{"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 10}, {"min_p", 0.05}, {"repetition_penalty", 1.1},
                 {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"logit_bias", {{"7", -100}, {"9", 2.5}}},
                 {"seed", 41}, {"n", 3}, {"stop", json::array({"x", "yz", ""})}, {"max_tokens", 9},
                 {"max_completion_tokens", 7}, {"stop_token_ids", json::array({5})}, {"ignore_eos", true},
                 {"logprobs", true}, {"top_logprobs", 4}, {"stream", true},
                 {"stream_options", {{"include_usage", true}}}, {"some_unknown_field", {{"a", 1}}},
                 {"user", "u-1"}}),
      m);
  ASSERT_EQ(r.choices.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const EngineRequest& e = r.choices[i];
    EXPECT_FLOAT_EQ(e.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(e.sampling.top_p, 0.9f);
    EXPECT_EQ(e.sampling.top_k, 10);
    EXPECT_FLOAT_EQ(e.sampling.min_p, 0.05f);
    EXPECT_FLOAT_EQ(e.sampling.repetition_penalty, 1.1f);
    EXPECT_FLOAT_EQ(e.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(e.sampling.frequency_penalty, -0.5f);
    ASSERT_EQ(e.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(e.sampling.logit_bias[0], std::make_pair(7, -100.0f));
    EXPECT_EQ(e.sampling.logit_bias[1], std::make_pair(9, 2.5f));
    ASSERT_TRUE(e.sampling.seed);
    EXPECT_EQ(*e.sampling.seed, 41u + i);  // choice i samples with seed + i
    EXPECT_EQ(e.stop, (std::vector<std::string>{"x", "yz"}));  // empty stop strings are dropped
    EXPECT_EQ(e.max_tokens, 7);                                   // max_completion_tokens wins
    EXPECT_EQ(e.stop_token_ids, std::vector<int32_t>{5});
    EXPECT_TRUE(e.ignore_eos);
    EXPECT_TRUE(e.sampling.logprobs);
    EXPECT_EQ(e.sampling.top_logprobs, 4);
  }
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs.enabled);
  EXPECT_EQ(r.logprobs.top, 4);
  // A single stop string, and null meaning "unset".
  CompletionRequest s = parse_chat_request(chat_body({{"stop", "END"}, {"temperature", nullptr}, {"n", nullptr}}), m);
  EXPECT_EQ(s.choices[0].stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(s.choices[0].sampling.temperature, 1.0f);
  EXPECT_EQ(s.choices.size(), 1u);
}

TEST(ServerProtocol, BadChatParametersNameTheParameter) {
  ServedModel m = test_model();
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"temperature", "hot"}}, "temperature"},
      {{{"temperature", -1}}, "temperature"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_k", 2.5}}, "top_k"},
      {{{"top_k", -2}}, "top_k"},
      {{{"min_p", 2}}, "min_p"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"presence_penalty", 3}}, "presence_penalty"},
      {{{"frequency_penalty", -2.5}}, "frequency_penalty"},
      {{{"frequency_penalty", true}}, "frequency_penalty"},
      {{{"logit_bias", json::array({1})}}, "logit_bias"},
      {{{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"999999", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", 101}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", "x"}}}}, "logit_bias"},
      {{{"seed", "x"}}, "seed"},
      {{{"seed", 1.5}}, "seed"},
      {{{"n", 0}}, "n"},
      {{{"n", 1000}}, "n"},
      {{{"stop", 5}}, "stop"},
      {{{"stop", json::array({1})}}, "stop"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", "10"}}, "max_tokens"},
      {{{"max_completion_tokens", -1}}, "max_completion_tokens"},
      {{{"max_tokens", 100000}}, "max_tokens"},  // prompt + max_tokens over the context
      {{{"logprobs", "yes"}}, "logprobs"},
      {{{"top_logprobs", 3}}, "top_logprobs"},  // needs logprobs
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},  // without stream
      {{{"stream", true}, {"stream_options", 1}}, "stream_options"},
      {{{"stop_token_ids", json::array({-1})}}, "stop_token_ids"},
      {{{"ignore_eos", 1}}, "ignore_eos"},
      {{{"model", 5}}, "model"},
      {{{"tools", json::array({{{"type", "function"}}})}}, "tools"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format"},
      {{{"messages", "hello"}}, "messages"},
      {{{"messages", json::array()}}, "messages"},
      {{{"messages", json::array({{{"content", "x"}}})}}, "messages"},
      {{{"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}}, "messages"},
      {{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, "messages"},
      {{{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}},
       "messages"},
      {{{"chat_template_kwargs", {{"enable_thinking", "yes"}}}}, "chat_template_kwargs.enable_thinking"},
  };
  for (const auto& [patch, param] : cases) EXPECT_EQ(rejected_param(chat_body(patch), ApiKind::Chat, m), param) << patch.dump();
  json no_messages = chat_body();
  no_messages.erase("messages");
  EXPECT_EQ(rejected_param(no_messages, ApiKind::Chat, m), "messages");
  // A prompt that fills the context leaves no room: named as the messages.
  ServedModel tiny = test_model(8);
  EXPECT_EQ(rejected_param(chat_body(), ApiKind::Chat, tiny), "messages");
  // What is not ours to check is ignored.
  EXPECT_EQ(rejected_param(chat_body({{"frobnicate", json::array()}, {"user", "me"}, {"tools", json::array()}}),
                           ApiKind::Chat, m),
            "<accepted>");
}

}  // namespace
