// The server-sent-event chunks of a streamed chat or text completion, built from synthetic engine events: the
// role chunk, deltas, finish and usage chunks, several choices, echo and an engine error mid-stream.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

TEST(ServerProtocol, ChatStreamChunks) {
  ServedModel m = test_model();
  CompletionRequest req =
      parse_chat_request(chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}}), m);
  SseStream s(req, m, "chatcmpl-7", 123);
  std::vector<json> start = frames(s.start());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(start[0]["id"], "chatcmpl-7");
  EXPECT_EQ(start[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(start[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(start[0].contains("usage") && start[0]["usage"].is_null());  // include_usage: null until the end

  std::vector<json> mid = frames(s.event(0, event("H\xC3\xA9", {token(70, NAN), token(71, NAN)})));
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(mid[0]["choices"][0]["delta"]["content"], "H\xC3\xA9");  // whole characters pass through
  EXPECT_FALSE(mid[0]["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(mid[0]["choices"][0]["logprobs"].is_null());

  EXPECT_TRUE(frames(s.event(0, event("", {token(72, NAN)}))).empty());  // no text yet: nothing to send

  std::vector<json> last = frames(s.event(0, event("!", {token(73, NAN)}, "length", 4)));
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0]["choices"][0]["delta"]["content"], "!");
  EXPECT_TRUE(last[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(last[1]["choices"][0]["delta"].empty());
  EXPECT_EQ(last[1]["choices"][0]["finish_reason"], "length");

  std::vector<json> tail = frames(s.finish());
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_TRUE(tail[0]["choices"].empty());
  EXPECT_EQ(tail[0]["usage"]["prompt_tokens"], req.prompt_tokens);
  EXPECT_EQ(tail[0]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(tail[0]["usage"]["total_tokens"], req.prompt_tokens + 4);
  EXPECT_EQ(tail[1], "[DONE]");
}

TEST(ServerProtocol, CompletionStreamChunksWithSeveralChoicesAndLogprobs) {
  ServedModel m = test_model();
  CompletionRequest req = parse_completion_request(completion_body({{"stream", true}, {"n", 2}, {"logprobs", 1}}), m);
  SseStream s(req, m, "cmpl-9", 5);
  EXPECT_EQ(s.start(), "");  // completions have no role chunk
  const int32_t a = id_of("a");
  std::vector<json> one = frames(s.event(1, event("a", {token(a, -0.25f, {{a, -0.25f}})})));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["object"], "text_completion");
  EXPECT_EQ(one[0]["choices"][0]["index"], 1);
  EXPECT_EQ(one[0]["choices"][0]["text"], "a");
  EXPECT_EQ(one[0]["choices"][0]["logprobs"]["tokens"][0], "a");
  EXPECT_FALSE(one[0].contains("usage"));  // no include_usage: no usage field at all
  // Logprobs without text still go out (the text is held back, e.g. a possible stop string).
  std::vector<json> held = frames(s.event(0, event("", {token(a, -0.5f, {{a, -0.5f}})})));
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0]["choices"][0]["text"], "");
  std::vector<json> end0 = frames(s.event(0, event("", {}, "stop", 1)));
  ASSERT_EQ(end0.size(), 1u);
  EXPECT_EQ(end0[0]["choices"][0]["index"], 0);
  EXPECT_EQ(end0[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(end0[0]["choices"][0]["text"], "");
  std::vector<json> tail = frames(s.finish());
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0], "[DONE]");
}

// Streaming echo, as vLLM streams it: a choice's first chunk is its prompt then its first text, with the prompt's
// tokens (first logprob null) before the first generated one; later chunks are plain deltas whose text_offset runs
// on; with max_tokens 0 the prompt alone, then the finish chunk.
TEST(ServerProtocol, CompletionStreamEchoesThePromptFirst) {
  ServedModel m = test_model();
  const int32_t a = id_of("a");
  CompletionRequest req = parse_completion_request(
      completion_body({{"prompt", json::array({2, a})}, {"stream", true}, {"echo", true}, {"logprobs", 0}}), m);
  SseStream s(req, m, "cmpl-e", 5);
  EngineEvent first = event("a", {token(a, -0.5f, {{a, -0.5f}})});
  first.prompt_logprobs = {token(a, -1.25f, {{a, -1.25f}})};
  std::vector<json> one = frames(s.event(0, first));
  ASSERT_EQ(one.size(), 1u);
  const std::string prompt_text = req.echo_texts[0];
  EXPECT_EQ(one[0]["choices"][0]["text"], prompt_text + "a");
  const json& lp = one[0]["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -1.25);
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][2].get<double>(), -0.5);
  std::vector<json> two = frames(s.event(0, event("a", {token(a, -0.75f, {{a, -0.75f}})}, "length", 2)));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0]["choices"][0]["text"], "a");  // no second echo
  EXPECT_EQ(two[0]["choices"][0]["logprobs"]["tokens"].size(), 1u);
  EXPECT_EQ(two[0]["choices"][0]["logprobs"]["text_offset"][0].get<int64_t>(),
            lp["text_offset"][2].get<int64_t>() + 1);

  CompletionRequest score = parse_completion_request(
      completion_body({{"prompt", json::array({2, a})}, {"stream", true}, {"echo", true}, {"max_tokens", 0}}), m);
  SseStream only(score, m, "cmpl-s", 5);
  std::vector<json> f = frames(only.event(0, event("", {}, "length", 0)));
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0]["choices"][0]["text"], score.echo_texts[0]);
  EXPECT_TRUE(f[0]["choices"][0]["logprobs"].is_null());  // no logprobs asked
  EXPECT_EQ(f[1]["choices"][0]["finish_reason"], "length");
}

TEST(ServerProtocol, StreamErrorEventIsAnErrorObject) {
  ServedModel m = test_model();
  CompletionRequest req = parse_chat_request(chat_body({{"stream", true}}), m);
  SseStream s(req, m, "chatcmpl-e", 5);
  EngineEvent e = event("", {}, "error");
  e.error = "the model failed";
  std::vector<json> f = frames(s.event(0, e));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0]["error"]["message"], "the model failed");
  EXPECT_EQ(f[0]["error"]["type"], "server_error");
}

}  // namespace
