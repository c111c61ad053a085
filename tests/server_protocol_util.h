#pragma once
// What the OpenAI wire-format tests (server_protocol_*_test.cc) share: a small Gemma-style tokenizer and a model served
// with it, request bodies, the parameter a refusal names, and the sampled tokens, engine events and server-sent-event
// frames a response is built from and read back as.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_protocol.h"
#include "text/tokenizer.h"

namespace qs::test {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// A small Gemma-style tokenizer: specials, <|turn>/<turn|>, 256 byte-fallback tokens, "▁" and printable ASCII.
inline const Tokenizer& test_tokenizer() {
  static const Tokenizer tok = [] {
    json added = json::array();
    json vocab = json::object();
    const char* specials[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"};
    for (int i = 0; i < 6; ++i) {
      added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
      vocab[specials[i]] = i;
    }
    int id = 6;
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
    vocab["\xE2\x96\x81"] = id++;
    for (char c = 33; c < 127; ++c) vocab[std::string(1, c)] = id++;
    json t = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}},
        {"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
        {"post_processor", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                    {{"type", "ByteFallback"}},
                                    {{"type", "Fuse"}}})}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", "<unk>"},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", json::array()}}}};
    return Tokenizer::from_json(t.dump(), "test-tokenizer.json");
  }();
  return tok;
}

inline ServedModel test_model(int64_t max_context = 512) {
  ServedModel m;
  m.name = "tiny-test";
  m.tokenizer = &test_tokenizer();
  m.generation = gemma4_release_generation_config();
  m.max_context = max_context;
  m.vocab_size = static_cast<int64_t>(test_tokenizer().vocab_size());
  return m;
}

inline json chat_body(json extra = json::object()) {
  json body = {{"model", "tiny-test"}, {"messages", json::array({{{"role", "user"}, {"content", "Hi there"}}})}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

inline json completion_body(json extra = json::object()) {
  json body = {{"model", "tiny-test"}, {"prompt", "abc def"}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// The parameter an ApiError names, or "<accepted>".
inline std::string rejected_param(const json& body, ApiKind kind, const ServedModel& model) {
  try {
    if (kind == ApiKind::Chat) parse_chat_request(body, model);
    else parse_completion_request(body, model);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_EQ(e.type(), "invalid_request_error");
    return e.param();
  }
  return "<accepted>";
}

inline SampledToken token(int32_t id, float lp, std::vector<std::pair<int32_t, float>> top = {}) {
  SampledToken t;
  t.id = id;
  t.logprob = lp;
  t.top_logprobs = std::move(top);
  return t;
}

inline int32_t id_of(const std::string& piece) { return *test_tokenizer().token_id(piece); }

// The frames of an SSE text: each "data: <json>" parsed; "[DONE]" kept as a string.
inline std::vector<json> frames(const std::string& text) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated frame";
    if (end == std::string::npos) break;
    std::string frame = text.substr(pos, end - pos);
    EXPECT_EQ(frame.rfind("data: ", 0), 0u) << frame;
    std::string payload = frame.substr(6);
    out.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
    pos = end + 2;
  }
  return out;
}

inline EngineEvent event(std::string text, std::vector<SampledToken> tokens, std::string finish = "",
                         int64_t completion_tokens = 0) {
  EngineEvent e;
  e.text = std::move(text);
  e.tokens = std::move(tokens);
  e.finished = !finish.empty();
  e.finish_reason = std::move(finish);
  e.completion_tokens = completion_tokens;
  return e;
}

}  // namespace qs::test
