#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint_tools/synth.h"
#include "formats/model_config.h"
#include "test_util.h"
#include "util/error.h"
#include "util/file.h"

namespace qs {
namespace {

using json = nlohmann::json;

const json& golden() {
  static const json g = [] {
    std::ifstream in(std::string(QATSERVE_SOURCE_DIR) + "/tests/golden/chat_gemma4.json");
    return json::parse(in);
  }();
  return g;
}

std::vector<ChatMessage> messages_of(const json& conversation) {
  std::vector<ChatMessage> out;
  for (const json& m : conversation) out.push_back({m.at("role"), m.at("content")});
  return out;
}

Gemma4TextConfig preset_text_config(const std::string& name) {
  return parse_model_config(preset_config_text(name), name).text;
}

std::string render(std::vector<ChatMessage> messages, ChatOptions options = {}) {
  return render_gemma4_chat(messages, options);
}

void write_file(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

// Renders every golden case of one template with the given dialect and expects jinja2's text; returns the count.
int expect_golden_cases(const std::string& template_name, const Gemma4ChatDialect& dialect) {
  const json& g = golden();
  int checked = 0;
  for (const json& c : g.at("cases")) {
    if (c.at("template") != template_name) continue;
    ChatOptions options;
    options.dialect = dialect;
    options.enable_thinking = c.at("enable_thinking");
    options.add_generation_prompt = c.at("add_generation_prompt");
    auto messages = messages_of(g.at("conversations").at(c.at("conversation").get<std::string>()));
    EXPECT_EQ(render_gemma4_chat(messages, options), c.at("expected").get<std::string>())
        << template_name << " / " << c.at("conversation") << " thinking=" << c.at("enable_thinking")
        << " generation_prompt=" << c.at("add_generation_prompt");
    ++checked;
  }
  return checked;
}

}  // namespace

// Both real templates, every conversation, thinking on/off, generation prompt on/off: identical to jinja2.
TEST(ChatTemplate, MatchesJinja2GoldenOnBothTemplates) {
  const json& g = golden();
  std::map<std::string, Gemma4ChatDialect> dialects;
  for (const auto& [name, t] : g.at("templates").items())
    dialects[name] = gemma4_chat_dialect_from_template(t.at("text").get<std::string>());
  ASSERT_EQ(dialects.size(), 2u);

  int checked = 0;
  for (const auto& [name, dialect] : dialects) checked += expect_golden_cases(name, dialect);
  EXPECT_GE(checked, 100);
}

TEST(ChatTemplate, DetectsEachTemplatesDialect) {
  const json& templates = golden().at("templates");
  Gemma4ChatDialect early =
      gemma4_chat_dialect_from_template(templates.at("gemma4_early").at("text").get<std::string>());
  EXPECT_TRUE(early.empty_thought_channel);
  EXPECT_FALSE(early.open_thought_channel);
  EXPECT_FALSE(early.newline_after_think);
  EXPECT_FALSE(early.merge_adjacent_assistant);

  Gemma4ChatDialect later =
      gemma4_chat_dialect_from_template(templates.at("gemma4_31b_later").at("text").get<std::string>());
  EXPECT_FALSE(later.empty_thought_channel);
  EXPECT_TRUE(later.open_thought_channel);
  EXPECT_TRUE(later.newline_after_think);
  EXPECT_TRUE(later.merge_adjacent_assistant);
}

TEST(ChatTemplate, DetectionIgnoresChannelOpenedOnlyAfterToolResponses) {
  // The long released templates open the channel after a tool response; that is not a plain generation prompt.
  std::string text = R"({%- if add_generation_prompt -%}
    {%- if ns.prev_message_type != 'tool_response' -%}
        {{- '<|turn>model\n' -}}
        {%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
    {%- elif ns.prev_message_type == 'tool_response' and enable_thinking -%}
        {{- '<|channel>thought\n' -}}
    {%- endif -%}
{%- endif -%})";
  Gemma4ChatDialect d = gemma4_chat_dialect_from_template(text);
  EXPECT_TRUE(d.empty_thought_channel);
  EXPECT_FALSE(d.open_thought_channel);
}

// The chat page offers its thinking switch only when the template reads enable_thinking; every Google one does.
TEST(ChatTemplate, DetectsTheThinkingSwitch) {
  const std::filesystem::path data = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/data/gemma4-tokenizer";
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    if (entry.path().extension() != ".jinja") continue;
    EXPECT_TRUE(gemma4_chat_dialect_from_template(read_file(entry.path())).has_thinking_switch) << entry.path();
  }
  EXPECT_FALSE(gemma4_chat_dialect_from_template("{{ bos_token }}{{ messages[0]['content'] }}").has_thinking_switch);
  EXPECT_TRUE(gemma4_chat_dialect_from_config(preset_text_config("e2b")).has_thinking_switch);
}

TEST(ChatTemplate, DetectionRejectsAnUnconditionalThoughtChannel) {
  std::string text = R"({%- if add_generation_prompt -%}{{- '<|turn>model\n<|channel>thought\n' -}}{%- endif -%})";
  EXPECT_THROW(gemma4_chat_dialect_from_template(text), Error);
}

TEST(ChatTemplate, DialectFromConfigWhenNoTemplate) {
  EXPECT_FALSE(gemma4_chat_dialect_from_config(preset_text_config("e2b")).empty_thought_channel);
  EXPECT_FALSE(gemma4_chat_dialect_from_config(preset_text_config("e4b")).empty_thought_channel);
  EXPECT_TRUE(gemma4_chat_dialect_from_config(preset_text_config("26b-a4b")).empty_thought_channel);
  EXPECT_TRUE(gemma4_chat_dialect_from_config(preset_text_config("31b")).empty_thought_channel);

  ChatOptions options;
  options.dialect = gemma4_chat_dialect_from_config(preset_text_config("31b"));
  EXPECT_EQ(render({{"user", "Hello"}}, options),
            "<bos><|turn>user\nHello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  options.dialect = gemma4_chat_dialect_from_config(preset_text_config("e4b"));
  EXPECT_EQ(render({{"user", "Hello"}}, options), "<bos><|turn>user\nHello<turn|>\n<|turn>model\n");
}

TEST(ChatTemplate, DialectForCheckpointPrefersTemplateFiles) {
  test::TempDir dir;
  auto e2b = preset_text_config("e2b");
  EXPECT_EQ(gemma4_chat_dialect_for_checkpoint(dir.path(), e2b), gemma4_chat_dialect_from_config(e2b));

  const std::string empty_channel =
      R"({%- if add_generation_prompt -%}{%- if not enable_thinking -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}{%- endif -%})";
  write_file(dir / "tokenizer_config.json", json{{"chat_template", empty_channel}}.dump());
  EXPECT_TRUE(gemma4_chat_dialect_for_checkpoint(dir.path(), e2b).empty_thought_channel);

  write_file(dir / "chat_template.jinja", "{{ bos_token }}<|think|>\\n");  // wins over tokenizer_config.json
  Gemma4ChatDialect d = gemma4_chat_dialect_for_checkpoint(dir.path(), e2b);
  EXPECT_FALSE(d.empty_thought_channel);
  EXPECT_TRUE(d.newline_after_think);
}

// A checkpoint laid out as Google ships one (tests/data/gemma4-tokenizer/): its tokenizer_config.json carries no
// chat_template, so the config decides, until the template file beside it (here the later 31B revision, whose
// dialect differs from the 31B config's default) is present; then every golden case renders as jinja2 did.
TEST(ChatTemplate, DialectForCheckpointLaidOutAsGoogleShipsIt) {
  const std::filesystem::path data = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/data/gemma4-tokenizer";
  test::TempDir dir;
  std::filesystem::copy_file(data / "tokenizer_config.gemma-4-E4B-it.resaved.json", dir / "tokenizer_config.json");
  auto config = preset_text_config("31b");
  EXPECT_EQ(gemma4_chat_dialect_for_checkpoint(dir.path(), config), gemma4_chat_dialect_from_config(config));

  std::filesystem::copy_file(data / "google-gemma-4-31B-it.from-llamacpp-fork.jinja", dir / "chat_template.jinja");
  Gemma4ChatDialect dialect = gemma4_chat_dialect_for_checkpoint(dir.path(), config);
  EXPECT_FALSE(dialect == gemma4_chat_dialect_from_config(config));
  EXPECT_GE(expect_golden_cases("gemma4_31b_later", dialect), 100);
}

TEST(ChatTemplate, RejectsEmptyConversationAndUnknownRoles) {
  EXPECT_THROW(render({}), Error);
  for (std::string role : {"model", "function", "User", ""}) {
    try {
      render({{"user", "hi"}, {role, "x"}});
      ADD_FAILURE() << "role '" << role << "' accepted";
    } catch (const Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("chat message 1"), std::string::npos) << what;
      EXPECT_NE(what.find("'" + role + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("system, developer, user, assistant, tool"), std::string::npos) << what;
    }
  }
}

TEST(ChatTemplate, BosTokenAndNoGenerationPrompt) {
  ChatOptions options;
  options.bos_token = "";
  options.add_generation_prompt = false;
  EXPECT_EQ(render({{"user", "a"}, {"assistant", "b"}}, options), "<|turn>user\na<turn|>\n<|turn>model\nb<turn|>\n");
}

TEST(ChatTemplate, PythonStripMatchesStrIsspace) {
  EXPECT_EQ(python_strip(" \t\n\v\f\r\x1c\x1d\x1e\x1fx y\x1f "), "x y");
  EXPECT_EQ(python_strip("\u00a0\u3000\u2028text\u2029\u205f\u0085"), "text");
  EXPECT_EQ(python_strip("\u200bzero width\ufeff"), "\u200bzero width\ufeff");  // not whitespace in Python
  EXPECT_EQ(python_strip("   "), "");
  EXPECT_EQ(python_strip(""), "");
}

TEST(ChatTemplate, StripThinkingFollowsTheTemplateMacro) {
  EXPECT_EQ(strip_thinking("<|channel>thought\nhmm<channel|>Answer"), "Answer");
  EXPECT_EQ(strip_thinking("a<|channel>x<channel|>b<|channel>y<channel|>c"), "abc");
  EXPECT_EQ(strip_thinking("kept<|channel>unclosed"), "kept");
  EXPECT_EQ(strip_thinking("x<channel|>y"), "xy");
  EXPECT_EQ(strip_thinking("  plain  "), "plain");
}

}  // namespace qs
