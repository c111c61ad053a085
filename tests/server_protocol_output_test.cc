// The body of a non-streaming chat or text completion built from the engine's results, and logprobs in both
// APIs' shapes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

TEST(ServerProtocol, NonStreamingResponses) {
  ServedModel m = test_model();
  CompletionRequest chat = parse_chat_request(chat_body({{"n", 2}}), m);
  std::vector<ChoiceResult> results(2);
  results[0].text = "ab";
  results[0].finish_reason = "stop";
  results[0].completion_tokens = 2;
  results[1].text = "abc";
  results[1].finish_reason = "length";
  results[1].completion_tokens = 3;
  ojson r = completion_response(chat, m, "chatcmpl-1", 1700000000, results);
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "tiny-test");
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][1]["message"]["content"], "abc");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], chat.prompt_tokens);  // the prompt once, as OpenAI counts it
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["usage"]["total_tokens"], chat.prompt_tokens + 5);

  CompletionRequest text = parse_completion_request(completion_body(), m);
  ojson t = completion_response(text, m, "cmpl-1", 1, std::span(results).first(1));
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "ab");
  EXPECT_FALSE(t["choices"][0].contains("message"));
}

TEST(ServerProtocol, Logprobs) {
  ServedModel m = test_model();
  const int32_t a = id_of("a"), b = id_of("b"), c3 = id_of("<0xC3>");
  std::vector<SampledToken> toks = {token(a, -0.5f, {{a, -0.5f}, {b, -1.5f}, {c3, -3.0f}}),
                                    token(c3, -std::numeric_limits<float>::infinity(), {{a, -0.1f}})};
  LogprobOptions o{true, 2, false};
  ojson chat = chat_logprobs(toks, o, test_tokenizer());
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "a");
  EXPECT_DOUBLE_EQ(chat["content"][0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(chat["content"][0]["bytes"], ojson::array({97}));
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);  // capped at top_logprobs
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], "b");
  EXPECT_EQ(chat["content"][1]["bytes"], ojson::array({0xC3}));   // a byte token is its byte
  EXPECT_DOUBLE_EQ(chat["content"][1]["logprob"].get<double>(), -9999.0);  // -inf as OpenAI writes it

  int64_t offset = 0;
  ojson text = completion_logprobs(toks, o, test_tokenizer(), offset);
  EXPECT_EQ(text["tokens"][0], "a");
  EXPECT_EQ(text["token_logprobs"].size(), 2u);
  EXPECT_EQ(text["text_offset"][0], 0);
  EXPECT_EQ(text["text_offset"][1], 1);
  EXPECT_EQ(text["top_logprobs"][0].size(), 2u);  // top 2 (the sampled "a" among them)
  EXPECT_EQ(text["top_logprobs"][1].size(), 2u);  // top 1 plus the sampled token
  EXPECT_GT(offset, 1);

  LogprobOptions ids{true, 1, true};
  ojson as_ids = chat_logprobs(toks, ids, test_tokenizer());
  EXPECT_EQ(as_ids["content"][0]["token"], fmt::format("token_id:{}", a));
  EXPECT_EQ(as_ids["content"][0]["top_logprobs"][0]["token"], fmt::format("token_id:{}", a));

  // Through a response: logprobs appear when asked.
  CompletionRequest req = parse_chat_request(chat_body({{"logprobs", true}, {"top_logprobs", 1}}), m);
  ChoiceResult res;
  res.text = "a";
  res.tokens = {toks[0]};
  res.finish_reason = "stop";
  res.completion_tokens = 1;
  ojson r = completion_response(req, m, "x", 0, std::span(&res, 1));
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
}

}  // namespace
