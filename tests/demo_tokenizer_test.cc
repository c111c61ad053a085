// The demo tokenizer committed in configs/demo-tokenizer/ (made by tools/python/make_demo_tokenizer.py): 4096 ids
// for the e2b-tiny preset, Gemma 4's control tokens at their real ids, byte fallback, and the ids Hugging Face
// `tokenizers` 0.23.3 gives for five strings (the golden block of its README.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_tools/synth.h"
#include "formats/model_config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/file.h"

namespace qs {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const fs::path kDir = fs::path(QATSERVE_SOURCE_DIR) / "configs" / "demo-tokenizer";
constexpr size_t kVocab = 4096;
constexpr int32_t kBos = 2, kTurn = 105, kEndTurn = 106, kNewline = 107, kFirstByte = 238, kLastByte = 493;

const Tokenizer& demo() {
  static const Tokenizer t = Tokenizer::load(kDir / "tokenizer.json");
  return t;
}

// The JSON list between <!-- golden:begin --> and <!-- golden:end --> in README.md, inside a ```json fence.
json golden() {
  std::string readme = read_file(kDir / "README.md");
  size_t begin = readme.find("<!-- golden:begin -->");
  size_t end = readme.find("<!-- golden:end -->");
  if (begin == std::string::npos || end == std::string::npos || end < begin) return json();
  size_t open = readme.find("```json\n", begin);
  size_t close = readme.rfind("```", end);
  if (open == std::string::npos || close == std::string::npos || close <= open) return json();
  open += 8;
  return json::parse(readme.substr(open, close - open));
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

bool is_byte_token(int32_t id) { return id >= kFirstByte && id <= kLastByte; }

}  // namespace

TEST(DemoTokenizer, HasExactly4096IdsLikeTheE2bTinyPreset) {
  EXPECT_EQ(demo().vocab_size(), kVocab);
  EXPECT_EQ(demo().model_vocab_size(), kVocab);
  ModelConfig preset = parse_model_config(preset_config_text("e2b-tiny"), "e2b-tiny");
  EXPECT_EQ(static_cast<size_t>(preset.text.vocab_size), kVocab);
  EXPECT_EQ(static_cast<size_t>(preset.text.vocab_size_per_layer_input), kVocab);
  // Every id has a piece, and nothing lies beyond the last one.
  for (int32_t id = 0; id < static_cast<int32_t>(kVocab); ++id) EXPECT_FALSE(demo().token_piece(id).empty()) << id;
  EXPECT_ANY_THROW(demo().token_piece(static_cast<int32_t>(kVocab)));
}

TEST(DemoTokenizer, ControlTokensHaveGemma4Ids) {
  const std::vector<std::pair<std::string, int32_t>> control = {
      {"<pad>", 0},
      {"<eos>", 1},
      {"<bos>", 2},
      {"<unk>", 3},
      {"<mask>", 4},
      {"<|tool>", 46},
      {"<tool|>", 47},
      {"<|tool_call>", 48},
      {"<tool_call|>", 49},
      {"<|tool_response>", 50},
      {"<tool_response|>", 51},
      {"<|\"|>", 52},
      {"<|think|>", 98},
      {"<|channel>", 100},
      {"<channel|>", 101},
      {"<|turn>", 105},
      {"<turn|>", 106},
  };
  for (const auto& [name, id] : control) {
    EXPECT_EQ(demo().token_id(name), id) << name;
    EXPECT_EQ(demo().token_piece(id), name);
    EXPECT_TRUE(demo().is_special(id)) << name;
    EXPECT_EQ(demo().encode(name), std::vector<int32_t>{id}) << name;
  }
  // "\n" is an ordinary token at Gemma's id; runs of newlines and of spaces are single tokens at Gemma's ids too.
  EXPECT_EQ(demo().token_id("\n"), kNewline);
  EXPECT_FALSE(demo().is_special(kNewline));
  EXPECT_EQ(demo().encode("\n"), std::vector<int32_t>{kNewline});
  EXPECT_EQ(demo().encode("\n\n\n"), std::vector<int32_t>{109});
  EXPECT_EQ(demo().token_id("\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81"), 140);  // "▁▁▁▁"
  EXPECT_EQ(demo().token_id("<0x00>"), kFirstByte);
  EXPECT_EQ(demo().token_id("<0xFF>"), kLastByte);
  EXPECT_EQ(demo().token_id("<b>"), 200);  // Gemma's HTML tags: added tokens, not special
  EXPECT_FALSE(demo().is_special(200));
}

TEST(DemoTokenizer, MatchesHuggingFaceTokenizersGolden) {
  json g = golden();
  ASSERT_TRUE(g.is_array()) << "no golden block in " << (kDir / "README.md");
  ASSERT_EQ(g.size(), 5u);
  for (const json& c : g) {
    std::string text = c.at("text");
    std::vector<int32_t> expected = ids_of(c.at("ids"));
    EXPECT_EQ(demo().encode(text), expected) << text;
    EXPECT_EQ(demo().decode(expected), text);
  }
}

TEST(DemoTokenizer, RoundTripsUnicodeAndEmojiThroughByteFallback) {
  const std::vector<std::string> texts = {
      "Hello, how are you today?",
      "  two leading spaces, a tab\there, and\n\nnewlines\n",
      "Grüße aus München! Привет, мир. 東京は晴れです。",
      // 🦙 🎉 ❤️ 👨‍👩‍👧
      "Emoji: \xF0\x9F\xA6\x99 \xF0\x9F\x8E\x89 \xE2\x9D\xA4\xEF\xB8\x8F "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "\xF0\x90\x8D\x88 \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",  // 𐍈 नमस्ते
      "def f(x):\n    return x * 2  # double\n",
  };
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = demo().encode(text);
    EXPECT_EQ(demo().decode(ids), text);
    for (int32_t id : ids) EXPECT_NE(id, 3) << "<unk> in " << text;
    StreamDecoder stream(demo(), /*skip_special_tokens=*/false);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, text);
  }
  // An emoji is not in the vocabulary: its four UTF-8 bytes become four byte tokens.
  std::vector<int32_t> llama = demo().encode("\xF0\x9F\xA6\x99");
  ASSERT_EQ(llama.size(), 4u);
  for (int32_t id : llama) EXPECT_TRUE(is_byte_token(id)) << id;
  EXPECT_EQ(llama[0], kFirstByte + 0xF0);
  // Ordinary English becomes whole-word tokens.
  EXPECT_LE(demo().encode("Hello, how are you today?").size(), 8u);
}

TEST(DemoTokenizer, ChatPromptEncodesControlTokensAsSingleIds) {
  // The dialect of the bundled template, as a checkpoint made with --tokenizer configs/demo-tokenizer gets it.
  ChatOptions options;
  options.dialect = gemma4_chat_dialect_from_template(read_file(kDir / "chat_template.jinja"));
  std::vector<ChatMessage> messages = {{"user", "Hello, how are you today?"}};
  std::string prompt = render_gemma4_chat(messages, options);
  ASSERT_EQ(prompt.rfind("<bos><|turn>user\nHello, how are you today?<turn|>\n<|turn>model\n", 0), 0u) << prompt;

  std::vector<int32_t> ids = demo().encode(prompt);
  std::vector<int32_t> expected = {kBos, kTurn};
  auto append = [&](const std::vector<int32_t>& more) { expected.insert(expected.end(), more.begin(), more.end()); };
  append(demo().encode("user"));
  expected.push_back(kNewline);
  append(demo().encode("Hello, how are you today?"));
  append({kEndTurn, kNewline, kTurn});
  append(demo().encode("model"));
  expected.push_back(kNewline);
  ASSERT_GE(ids.size(), expected.size());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(expected.size())), expected);
  EXPECT_EQ(demo().decode(ids), prompt);
  EXPECT_EQ(demo().decode(ids, /*skip_special_tokens=*/true).rfind("user\nHello, how are you today?\nmodel\n", 0), 0u);

  // tokenizer_config.json: the template writes <bos>, so the tokenizer must not add it again.
  json config = json::parse(read_file(kDir / "tokenizer_config.json"));
  EXPECT_EQ(config.at("add_bos_token"), false);
  EXPECT_EQ(config.at("bos_token"), "<bos>");
  EXPECT_EQ(config.at("eos_token"), "<eos>");
  EXPECT_FALSE(config.contains("chat_template"));
}

}  // namespace qs
