// POST /v1/completions' request without a socket: prompts as text, token ids and batches of either, echo with the
// prompt's logprobs, and the parameters it refuses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

// A batch of prompts with n: each prompt's choices in turn; echo keeps each prompt's text and asks the engine to
// score it (max_tokens 0 only with echo).
TEST(ServerProtocol, CompletionBatchAndEcho) {
  ServedModel m = test_model();
  CompletionRequest r = parse_completion_request(
      completion_body({{"prompt", json::array({"abc", json::array({2, 70, 71})})}, {"max_tokens", 0}, {"echo", true},
                       {"logprobs", 2}}),
      m);
  ASSERT_EQ(r.choices.size(), 2u);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.echo_texts, (std::vector<std::string>{"abc", test_tokenizer().decode(std::vector<int32_t>{2, 70, 71}, false)}));
  EXPECT_EQ(r.choices[1].prompt, (std::vector<int32_t>{2, 70, 71}));
  EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(r.choices[0].prompt.size() + 3));
  for (const EngineRequest& e : r.choices) {
    EXPECT_EQ(e.max_tokens, 0);
    EXPECT_EQ(e.prompt_logprobs, 2);
  }
  CompletionRequest plain = parse_completion_request(completion_body({{"prompt", json::array({"a", "b"})}, {"n", 2}}), m);
  EXPECT_EQ(plain.choices.size(), 4u);
  EXPECT_FALSE(plain.choices[0].prompt_logprobs);
}

// The legacy logprobs object over an echoed prompt: the first token's logprob and alternatives are null, offsets run
// on into the completion.
TEST(ServerProtocol, EchoLogprobsObject) {
  const std::vector<int32_t> prompt = {2, 70, 71};
  std::vector<SampledToken> scores = {{70, -1.5f, {{70, -1.5f}}}, {71, -0.25f, {{72, -0.1f}}}};
  std::vector<SampledToken> generated = {{73, -2.0f, {}}};
  LogprobOptions options{true, 1, false};
  int64_t end_offset = 0;
  auto lp = echo_completion_logprobs(prompt, scores, generated, options, test_tokenizer(), end_offset);
  ASSERT_EQ(lp["tokens"].size(), 4u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -1.5);
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][3].get<double>(), -2.0);
  EXPECT_EQ(lp["top_logprobs"][2].size(), 2u);  // the best alternative and the token itself
  int64_t offset = 0;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), offset);
    for (unsigned char c : lp["tokens"][i].get<std::string>()) offset += (c & 0xC0) != 0x80;  // characters
  }
  EXPECT_EQ(end_offset, offset);
}

TEST(ServerProtocol, CompletionPrompts) {
  ServedModel m = test_model();
  std::vector<int32_t> text_ids = {2};
  auto enc = test_tokenizer().encode("abc def");
  text_ids.insert(text_ids.end(), enc.begin(), enc.end());
  EXPECT_EQ(parse_completion_request(completion_body(), m).choices[0].prompt, text_ids);  // BOS prepended
  EXPECT_EQ(parse_completion_request(completion_body({{"prompt", json::array({"abc def"})}}), m).choices[0].prompt,
            text_ids);
  EXPECT_EQ(parse_completion_request(completion_body({{"prompt", json::array({2, 70, 71})}}), m).choices[0].prompt,
            (std::vector<int32_t>{2, 70, 71}));
  EXPECT_EQ(parse_completion_request(completion_body({{"prompt", json::array({json::array({2, 9})})}}), m)
                .choices[0]
                .prompt,
            (std::vector<int32_t>{2, 9}));
  CompletionRequest lp = parse_completion_request(completion_body({{"logprobs", 3}, {"max_tokens", 5}}), m);
  EXPECT_TRUE(lp.logprobs.enabled);
  EXPECT_EQ(lp.logprobs.top, 3);
  EXPECT_EQ(lp.choices[0].max_tokens, 5);
  EXPECT_TRUE(lp.choices[0].sampling.logprobs);
  EXPECT_EQ(lp.choices[0].sampling.top_logprobs, 3);
  // max_completion_tokens is a chat field only.
  EXPECT_EQ(parse_completion_request(completion_body({{"max_completion_tokens", 3}}), m).choices[0].max_tokens,
            512 - static_cast<int64_t>(text_ids.size()));

  const std::vector<std::pair<json, std::string>> bad = {
      {{{"prompt", 5}}, "prompt"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", json::array({99999})}}, "prompt"},
      {{{"prompt", json::array({-1})}}, "prompt"},
      {{{"prompt", json::array({"a", 5})}}, "prompt"},
      {{{"prompt", json::array({json::array({1}), json::array()})}}, "prompt"},
      {{{"prompt", json::array({1, "b"})}}, "prompt"},
      {{{"logprobs", true}}, "logprobs"},
      {{{"logprobs", 50}}, "logprobs"},
      {{{"echo", 1}}, "echo"},
      {{{"echo", true}, {"n", 2}}, "n"},
      {{{"echo", true}, {"best_of", 1}}, "best_of"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"suffix", "x"}}, "suffix"},
      {{{"best_of", 3}}, "best_of"},
      {{{"max_tokens", 600}}, "max_tokens"},
  };
  for (const auto& [patch, param] : bad)
    EXPECT_EQ(rejected_param(completion_body(patch), ApiKind::Completion, m), param) << patch.dump();
  json no_prompt = completion_body();
  no_prompt.erase("prompt");
  EXPECT_EQ(rejected_param(no_prompt, ApiKind::Completion, m), "prompt");
}

}  // namespace
