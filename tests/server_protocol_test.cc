// The OpenAI wire format without a socket: request parsing and validation (every error names its parameter),
// response bodies, logprobs, and the server-sent-event chunks of a stream.
#include "server/image_budget.h"
#include "server/openai_protocol.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/lora_adapter.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace qs;

// A small Gemma-style tokenizer: specials, <|turn>/<turn|>, 256 byte-fallback tokens, "▁" and printable ASCII.
const Tokenizer& test_tokenizer() {
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

ServedModel test_model(int64_t max_context = 512) {
  ServedModel m;
  m.name = "tiny-test";
  m.tokenizer = &test_tokenizer();
  m.generation = gemma4_release_generation_config();
  m.max_context = max_context;
  m.vocab_size = static_cast<int64_t>(test_tokenizer().vocab_size());
  return m;
}

json chat_body(json extra = json::object()) {
  json body = {{"model", "tiny-test"}, {"messages", json::array({{{"role", "user"}, {"content", "Hi there"}}})}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

json completion_body(json extra = json::object()) {
  json body = {{"model", "tiny-test"}, {"prompt", "abc def"}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// The parameter an ApiError names, or "<accepted>".
std::string rejected_param(const json& body, ApiKind kind, const ServedModel& model) {
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

SampledToken token(int32_t id, float lp, std::vector<std::pair<int32_t, float>> top = {}) {
  SampledToken t;
  t.id = id;
  t.logprob = lp;
  t.top_logprobs = std::move(top);
  return t;
}

int32_t id_of(const std::string& piece) { return *test_tokenizer().token_id(piece); }

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

// The frames of an SSE text: each "data: <json>" parsed; "[DONE]" kept as a string.
std::vector<json> frames(const std::string& text) {
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

EngineEvent event(std::string text, std::vector<SampledToken> tokens, std::string finish = "",
                  int64_t completion_tokens = 0) {
  EngineEvent e;
  e.text = std::move(text);
  e.tokens = std::move(tokens);
  e.finished = !finish.empty();
  e.finish_reason = std::move(finish);
  e.completion_tokens = completion_tokens;
  return e;
}

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

TEST(ServerProtocol, RequestIds) {
  std::string a = new_request_id(ApiKind::Chat), b = new_request_id(ApiKind::Chat);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(new_request_id(ApiKind::Completion).rfind("cmpl-", 0), 0u);
}

// --- tools, tool_choice, response_format, reasoning --------------------------------------------------------------

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
  EXPECT_FALSE(automatic.choices[0].constraint.active());
  EXPECT_TRUE(automatic.parsing.enabled && automatic.parsing.tool_calls);
  EXPECT_TRUE(automatic.choices[0].keep_chat_markers);  // the parser reads the markers

  CompletionRequest none = parse_chat_request(tools_body({{"tool_choice", "none"}}), m);
  EXPECT_FALSE(none.choices[0].constraint.active());
  EXPECT_FALSE(none.parsing.tool_calls);
  EXPECT_EQ(none.prompt_tokens, automatic.prompt_tokens);  // tools are still declared

  CompletionRequest required = parse_chat_request(tools_body({{"tool_choice", "required"}}), m);
  const ConstraintSpec& r = required.choices[0].constraint;
  EXPECT_EQ(r.kind, ConstraintSpec::Kind::ToolCalls);
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].parameters.at("required"), json::array({"city"}));
  EXPECT_TRUE(r.parallel_calls);
  EXPECT_FALSE(r.after_thinking);

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
  EXPECT_TRUE(n.after_thinking);
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
    EXPECT_TRUE(e.constraint.after_thinking);
  }
  EXPECT_EQ(rejected_param(completion_body({{"response_format", {{"type", "json_object"}}}}), ApiKind::Completion, m),
            "response_format");
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

namespace {

json image_part(std::string url = "data:image/png;base64,Zm9v") {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}
json audio_part(std::string data = "UklGRg==") {
  return {{"type", "input_audio"}, {"input_audio", {{"data", data}, {"format", "wav"}}}};
}
json text_part(std::string text) { return {{"type", "text"}, {"text", text}}; }

json media_chat(json content, std::string role = "user") {
  return {{"messages", json::array({{{"role", role}, {"content", content}}})}};
}

// The message of the 400 a chat body gets (its param must be "messages"), or "<accepted>".
std::string media_error(const json& body, const ServedModel& model) {
  try {
    parse_chat_request(body, model);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "messages") << e.what();
    return e.what();
  }
  return "<accepted>";
}

ServedModel media_model(bool images, bool audio) {
  ServedModel m = test_model();
  m.media.images = images;
  m.media.audio = audio;
  return m;
}

TEST(ServerProtocol, MediaPartsBecomeMediaInputsInPromptOrder) {
  CompletionRequest r = parse_chat_request(
      media_chat(json::array({text_part("Look: "), image_part(), text_part("and "), audio_part(),
                              image_part("data:image/jpeg;base64,YmFy")})),
      media_model(true, true));
  ASSERT_EQ(r.media.size(), 3u);
  EXPECT_EQ(r.media[0].kind, media::MediaKind::Image);
  EXPECT_EQ(r.media[0].bytes, "foo");
  EXPECT_EQ(r.media[0].where, "messages[0].content[1].image_url.url");
  EXPECT_EQ(r.media[1].kind, media::MediaKind::Audio);
  EXPECT_EQ(r.media[1].bytes, "RIFF");
  EXPECT_EQ(r.media[1].declared_format, "wav");
  EXPECT_EQ(r.media[1].where, "messages[0].content[3]");
  EXPECT_EQ(r.media[2].declared_format, "jpeg");
}

TEST(ServerProtocol, MediaTheModelCannotReadIsRefusedNamingThePart) {
  const json body = media_chat(json::array({text_part("Hi"), audio_part()}));
  EXPECT_EQ(media_error(body, media_model(true, false)),
            "messages[0].content[1]: this model does not read audio input (no audio tower is loaded)");
  EXPECT_EQ(media_error(media_chat(json::array({image_part()})), test_model()),
            "messages[0].content[0]: this model does not read image input (no vision tower is loaded)");
  EXPECT_EQ(media_error(body, media_model(false, true)), "<accepted>");
}

TEST(ServerProtocol, BadMediaPartsAreRefusedNamingThePart) {
  ServedModel m = media_model(true, true);
  EXPECT_NE(media_error(media_chat(json::array({image_part("https://example.com/cat.png")})), m)
                .find("messages[0].content[0].image_url.url: this server does not fetch images from URLs (its "
                      "operator allows hosts with --allowed-media-domains)"),
            std::string::npos);
  // With hosts allowed, a URL goes to the fetch (media_fetch_test.cc), whose refusal is the part's 400.
  m.media.fetch.allowed_hosts = {"127.0.0.1"};
  EXPECT_EQ(media_error(media_chat(json::array({image_part("HTTPS://example.com/cat.png")})), m),
            "messages[0].content[0].image_url.url: HTTPS://example.com/cat.png: the host 'example.com' is not one "
            "this server fetches media from");
  m.media.fetch = {};
  EXPECT_EQ(media_error(media_chat(json::array({image_part("data:image/png;base64,Zm9v!mFy")})), m),
            "messages[0].content[0].image_url.url: byte 4 of the base64 data (0x21) is not in the base64 alphabet");
  EXPECT_EQ(media_error(media_chat(json::array({{{"type", "image_url"}}})), m),
            "messages[0].content[0].image_url.url is required (a data:image/...;base64 URL)");
  EXPECT_NE(media_error(media_chat(json::array({{{"type", "input_audio"}, {"input_audio", {{"data", "Zg=="}}}}})), m)
                .find("messages[0].content[0].input_audio needs data"),
            std::string::npos);
  EXPECT_EQ(media_error(media_chat(json::array({{{"type", "video_url"}}})), m),
            "messages[0].content[0]: the part type must be \"text\", \"image_url\" or \"input_audio\"");
  EXPECT_EQ(media_error(media_chat(json::array({image_part()}), "system"), m),
            "messages[0].content[0]: image_url parts are read in user and assistant messages only, not in a system "
            "message");
  m.media.max_bytes = 2;
  EXPECT_EQ(media_error(media_chat(json::array({image_part()})), m),
            "messages[0].content[0].image_url.url: the media is 3 bytes; this server accepts at most 2");
}

// Per-image budgets: detail low = 70, high = the server's largest, auto or absent = the request's budget, which is
// mm_processor_kwargs.max_soft_tokens (vLLM's) or the server's default; audio keeps none. Bad values: 400s naming
// the part or mm_processor_kwargs.
TEST(ServerProtocol, ImageBudgetsFromDetailAndMmProcessorKwargs) {
  ServedModel m = media_model(true, true);
  m.media.image_soft_tokens = 140;
  m.media.max_image_soft_tokens = 560;
  auto detailed = [](std::string detail) {
    json part = image_part();
    part["image_url"]["detail"] = detail;
    return part;
  };
  const json content = json::array({image_part(), detailed("low"), detailed("high"), detailed("auto"), audio_part()});
  auto budgets = [&](json body) {
    std::vector<int> out;
    for (const media::MediaInput& input : parse_chat_request(body, m).media) out.push_back(input.image_soft_tokens);
    return out;
  };
  EXPECT_EQ(budgets(media_chat(content)), (std::vector<int>{140, 70, 560, 140, 0}));
  json body = media_chat(content);
  body["mm_processor_kwargs"] = {{"max_soft_tokens", 280}};
  EXPECT_EQ(budgets(body), (std::vector<int>{280, 70, 560, 280, 0}));

  EXPECT_EQ(media_error(media_chat(json::array({detailed("medium")})), m),
            "messages[0].content[0].image_url.detail is \"medium\"; expected \"low\" (70 soft tokens), \"high\" (560) "
            "or \"auto\"");
  for (const auto& [kwargs, message] : std::vector<std::pair<json, std::string>>{
           {{{"max_soft_tokens", 100}}, "mm_processor_kwargs.max_soft_tokens is 100; expected one of 70, 140, 280, 560, 1120"},
           {{{"max_soft_tokens", "70"}}, "mm_processor_kwargs.max_soft_tokens is \"70\"; expected one of 70, 140, 280, 560, 1120"},
           {{{"max_soft_tokens", 1120}}, "mm_processor_kwargs.max_soft_tokens is 1120; this server allows at most 560 per image (serve --max-image-soft-tokens)"},
           {{{"do_pan_and_scan", true}}, "mm_processor_kwargs.do_pan_and_scan is not supported; Gemma 4's processor takes max_soft_tokens"},
           {json::array({1}), "mm_processor_kwargs must be an object, got [1]"}}) {
    json bad = media_chat(content);
    bad["mm_processor_kwargs"] = kwargs;
    try {
      parse_chat_request(bad, m);
      ADD_FAILURE() << kwargs.dump() << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "mm_processor_kwargs");
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// serve's flags over the processor's budget.
TEST(ServerProtocol, ServeImageBudgets) {
  EXPECT_EQ(resolve_image_budgets(0, 0, 280).fallback, 280);
  EXPECT_EQ(resolve_image_budgets(0, 0, 280).max, 280);
  EXPECT_EQ(resolve_image_budgets(70, 0, 280).max, 70);
  EXPECT_EQ(resolve_image_budgets(0, 1120, 280).max, 1120);
  EXPECT_THROW(resolve_image_budgets(560, 280, 280), Error);  // the largest below the default
  EXPECT_THROW(resolve_image_budgets(100, 0, 280), Error);
}

TEST(ServerProtocol, TooManyMediaItemsAreRefusedAtTheFirstOneOver) {
  ServedModel m = media_model(true, true);
  json parts = json::array();
  for (int i = 0; i < 100; ++i) parts.push_back(image_part());
  EXPECT_EQ(media_error(media_chat(parts), m),
            fmt::format("messages[0].content[{}]: a request may carry at most {} images and audio clips",
                        m.media.max_items, m.media.max_items));
}

TEST(ServerProtocol, TokenizeRefusesMediaItCannotCount) {
  ServedModel m = media_model(true, true);
  try {
    parse_tokenize_request(media_chat(json::array({image_part()})), m);
    FAIL() << "tokenized an image";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("messages[0].content[0].image_url.url: /tokenize counts text only"),
              std::string::npos);
  }
}

}  // namespace
