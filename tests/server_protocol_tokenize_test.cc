// POST /tokenize and /detokenize without a socket: a prompt or a chat's messages to token ids (with the BOS the
// completions and chat endpoints would add), and ids back; bad fields are 400s that name them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

TEST(ServerProtocol, TokenizeAndDetokenize) {
  ServedModel m = test_model();
  auto enc = test_tokenizer().encode("abc");
  std::vector<int32_t> with_bos = {2};
  with_bos.insert(with_bos.end(), enc.begin(), enc.end());
  EXPECT_EQ(parse_tokenize_request({{"prompt", "abc"}}, m), with_bos);
  EXPECT_EQ(parse_tokenize_request({{"prompt", "abc"}, {"add_special_tokens", false}}, m), enc);
  EXPECT_EQ(parse_tokenize_request(chat_body(), m), parse_chat_request(chat_body(), m).choices[0].prompt);
  EXPECT_EQ(parse_detokenize_request({{"tokens", json::array({2, 70})}}, m), (std::vector<int32_t>{2, 70}));
  for (const json& bad : {json{{"tokens", json::array({-1})}}, json{{"tokens", "x"}}, json::object()}) {
    try {
      parse_detokenize_request(bad, m);
      ADD_FAILURE() << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "tokens");
    }
  }
  try {
    parse_tokenize_request({{"prompt", 5}}, m);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "prompt");
  }
}

}  // namespace
