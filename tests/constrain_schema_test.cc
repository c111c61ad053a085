// The grammar engine's pieces: grammar builder, regex subset, JSON Schema compiler (every keyword accepts what it
// should and refuses what it should; errors name keyword and pointer), on the demo tokenizer's vocabulary.
// The external check of the same (jsonschema on random walks) is tests/constrain/run_constrained_outputs_test.sh.
#include <gtest/gtest.h>

#include "constrain/json_schema.h"
#include "constrain/matcher.h"
#include "constrain/regex.h"
#include "text/tokenizer.h"

namespace qs {
namespace {

using json = nlohmann::json;

const Tokenizer& demo_tokenizer() {
  static const Tokenizer t = Tokenizer::load(std::string(QATSERVE_SOURCE_DIR) + "/configs/demo-tokenizer/tokenizer.json");
  return t;
}
std::shared_ptr<const VocabIndex> demo_vocab() {
  static auto v = std::make_shared<const VocabIndex>(demo_tokenizer(), demo_tokenizer().vocab_size());
  return v;
}

// Whether the grammar derives exactly `text` (bytes; "\x01" stands for the special token <|"|>).
bool derives(const GrammarNetwork& net, std::string_view text) {
  GrammarMatcher m(std::make_shared<CompiledGrammar>(net, demo_vocab()), {});
  for (char c : text) {
    if (c == '\x01' ? !m.accept_token(52) : !m.accept_bytes(std::string_view(&c, 1))) return false;
  }
  return m.is_complete();
}
bool valid(const json& schema, std::string_view text) { return derives(json_schema_grammar(schema, JsonSyntax::Json), text); }
bool gemma(const json& schema, std::string_view text) {
  return derives(json_schema_grammar(schema, JsonSyntax::GemmaCall), text);
}

GrammarNetwork grammar_of(const std::function<GrammarBuilder::Node(GrammarBuilder&)>& body) {
  GrammarBuilder g;
  auto root = g.declare("root");
  g.define(root, body(g));
  return g.build(root);
}

TEST(ConstrainGrammar, LiteralsAlternativesRepetitionAndRecursion) {
  auto net = grammar_of([](GrammarBuilder& g) {
    return g.seq({g.literal("a"), g.alt({g.literal("b"), g.literal("cd")}), g.repeat(g.byte_range('0', '9'), 1, 3)});
  });
  EXPECT_TRUE(derives(net, "ab1"));
  EXPECT_TRUE(derives(net, "acd123"));
  EXPECT_FALSE(derives(net, "acd1234"));
  EXPECT_FALSE(derives(net, "ab"));
  EXPECT_FALSE(derives(net, "ac1"));
  // Balanced parentheses: recursion through a rule.
  GrammarBuilder g;
  auto p = g.declare("p");
  g.define(p, g.star(g.seq({g.literal("("), g.ref(p), g.literal(")")})));
  auto net2 = g.build(p);
  EXPECT_TRUE(derives(net2, "(()())()"));
  EXPECT_TRUE(derives(net2, ""));
  EXPECT_FALSE(derives(net2, "(()"));
  EXPECT_FALSE(derives(net2, "())"));
}

TEST(ConstrainGrammar, RootThatDerivesNothingIsAnError) {
  GrammarBuilder g;
  auto r = g.declare("r");
  g.define(r, g.seq({g.literal("x"), g.ref(r)}));  // only infinite strings
  EXPECT_THROW(g.build(r), Error);
  EXPECT_THROW(grammar_of([](GrammarBuilder& g) { return g.alt({}); }), Error);
}

TEST(ConstrainRegex, SubsetFollowsPythonSearch) {
  auto accepts = [](std::string_view pattern, std::string_view s) {
    return derives(grammar_of([&](GrammarBuilder& g) { return compile_pattern(g, pattern, utf8_char); }), s);
  };
  EXPECT_TRUE(accepts("^[a-c]+x?$", "abca"));
  EXPECT_FALSE(accepts("^[a-c]+x?$", "abcd"));
  EXPECT_TRUE(accepts("b", "abc"));  // unanchored: anywhere
  EXPECT_TRUE(accepts("^\\d{2,3}-(?:ab|cd)$", "123-cd"));
  EXPECT_FALSE(accepts("^\\d{2,3}-(?:ab|cd)$", "1-cd"));
  EXPECT_TRUE(accepts("^[^a-z]$", "\xc3\xa9"));  // é: the complement is Unicode-wide
  EXPECT_FALSE(accepts("^\\S$", "\x1d"));        // Python's \s matches \x1c-\x1f
  EXPECT_TRUE(accepts("^a.c$", "a\xe2\x82\xac" "c"));
  EXPECT_FALSE(accepts("^a.c$", "a\nc"));
  EXPECT_TRUE(accepts("^x$|^y", "yz"));
  for (const char* bad : {"(?=a)", "a*?", "\\b", "(a", "a{2,1}", "\\1"})
    EXPECT_THROW(grammar_of([&](GrammarBuilder& g) { return compile_pattern(g, bad, utf8_char); }), Error) << bad;
  // Groups nest at most 64 deep: deeper, a clear error instead of a recursion as deep as the pattern is long.
  EXPECT_TRUE(accepts(std::string(64, '(') + "a" + std::string(64, ')'), "a"));
  const std::string deep = std::string(100000, '(') + std::string(100000, ')');
  try {
    grammar_of([&](GrammarBuilder& g) { return compile_pattern(g, deep, utf8_char); });
    ADD_FAILURE() << "a pattern of 100000 nested groups was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups nested more than 64 deep"), std::string::npos);
  }
}

TEST(ConstrainSchema, Types) {
  EXPECT_TRUE(valid({{"type", "string"}}, "\"a\\\"b\\n\""));
  EXPECT_FALSE(valid({{"type", "string"}}, "\"a\nb\""));  // raw control characters are not JSON
  EXPECT_TRUE(valid({{"type", "integer"}}, "-120"));
  EXPECT_FALSE(valid({{"type", "integer"}}, "012"));
  EXPECT_FALSE(valid({{"type", "integer"}}, "1.5"));
  EXPECT_TRUE(valid({{"type", "number"}}, "-0.25e+3"));
  EXPECT_TRUE(valid({{"type", "boolean"}}, "false"));
  EXPECT_TRUE(valid({{"type", "null"}}, "null"));
  EXPECT_TRUE(valid({{"type", {"string", "null"}}}, "null"));
  EXPECT_FALSE(valid({{"type", {"string", "null"}}}, "1"));
  EXPECT_TRUE(valid(json::object(), "[1, {\"a\": \"b\"}]"));  // {} = any value
  EXPECT_TRUE(valid(true, "{}"));
}

TEST(ConstrainSchema, ObjectsPropertiesRequiredAdditional) {
  json s = {{"type", "object"},
            {"properties", {{"b", {{"type", "integer"}}}, {"a", {{"type", "string"}}}}},
            {"required", {"b"}}};
  EXPECT_TRUE(valid(s, "{\"a\": \"x\", \"b\": 1}"));
  EXPECT_TRUE(valid(s, "{\"b\":1}"));
  EXPECT_FALSE(valid(s, "{\"a\":\"x\"}"));         // b is required
  EXPECT_FALSE(valid(s, "{\"b\":1,\"c\":2}"));     // no extras unless asked for
  EXPECT_FALSE(valid(s, "{\"b\":1,  \"a\":\"x\"}"));  // at most one space
  EXPECT_FALSE(valid(s, "{\"b\":1,\n\"a\":\"x\"}"));  // no newline
  s["additionalProperties"] = {{"type", "boolean"}};
  EXPECT_TRUE(valid(s, "{\"b\":1,\"c\":true,\"zz\":false}"));
  EXPECT_FALSE(valid(s, "{\"b\":1,\"c\":2}"));
  EXPECT_FALSE(valid(s, "{\"b\":1,\"a\":true}"));  // a declared name is not an extra
  EXPECT_TRUE(valid({{"type", "object"}}, "{\"any key\": [null]}"));
  EXPECT_TRUE(derives(json_object_grammar(), "{\"k\": {\"n\": -1.5}}"));
  EXPECT_FALSE(derives(json_object_grammar(), "[]"));
}

TEST(ConstrainSchema, ArraysItemsPrefixItemsCounts) {
  json s = {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}, {"maxItems", 2}};
  EXPECT_FALSE(valid(s, "[]"));
  EXPECT_TRUE(valid(s, "[1, 2]"));
  EXPECT_FALSE(valid(s, "[1,2,3]"));
  json t = {{"prefixItems", {{{"type", "string"}}, {{"type", "boolean"}}}}, {"items", false}};
  EXPECT_TRUE(valid(t, "[\"a\",true]"));
  EXPECT_TRUE(valid(t, "[\"a\"]"));
  EXPECT_FALSE(valid(t, "[\"a\",true,1]"));
  EXPECT_FALSE(valid(t, "[true]"));
}

TEST(ConstrainSchema, StringLengthsPatternsFormats) {
  json s = {{"type", "string"}, {"minLength", 2}, {"maxLength", 3}};
  EXPECT_FALSE(valid(s, "\"a\""));
  EXPECT_TRUE(valid(s, "\"\xc3\xa9\xc3\xa9\""));  // two characters, four bytes
  EXPECT_FALSE(valid(s, "\"abcd\""));
  EXPECT_TRUE(valid({{"type", "string"}, {"pattern", "^a\"b$"}}, "\"a\\\"b\""));  // written escaped
  EXPECT_TRUE(valid({{"type", "string"}, {"format", "date"}}, "\"2024-02-28\""));
  EXPECT_FALSE(valid({{"type", "string"}, {"format", "date"}}, "\"2024-02-30\""));
  EXPECT_TRUE(valid({{"type", "string"}, {"format", "date-time"}}, "\"2024-02-28T13:05:00.5+01:00\""));
  EXPECT_TRUE(valid({{"type", "string"}, {"format", "uuid"}}, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_TRUE(valid({{"type", "string"}, {"format", "email"}}, "\"a.b@example.com\""));
  EXPECT_FALSE(valid({{"type", "string"}, {"format", "email"}}, "\"nobody\""));
}

TEST(ConstrainSchema, NumericBounds) {
  json s = {{"type", "integer"}, {"minimum", -5}, {"exclusiveMaximum", 120}};
  for (const char* ok : {"-5", "0", "7", "119"}) EXPECT_TRUE(valid(s, ok)) << ok;
  for (const char* bad : {"-6", "120", "1000", "-0"}) EXPECT_FALSE(valid(s, bad)) << bad;
  json n = {{"type", "number"}, {"exclusiveMinimum", 0.5}, {"maximum", 3}};
  for (const char* ok : {"1", "2.75", "3", "1.0"}) EXPECT_TRUE(valid(n, ok)) << ok;
  for (const char* bad : {"0", "3.5", "-1.5", "4"}) EXPECT_FALSE(valid(n, bad)) << bad;
  json neg = {{"type", "number"}, {"minimum", -2}, {"maximum", -1}};
  EXPECT_TRUE(valid(neg, "-1.5"));
  EXPECT_FALSE(valid(neg, "-2.5"));
}

// Bounds of 19 digits (fuzz/json_schema_fuzz found them taking 2^19 steps): the grammar stays linear in the digits.
TEST(ConstrainSchema, WideNumericBoundsStaySmall) {
  json s = {{"type", "number"}, {"exclusiveMinimum", -1999999999999999999.5}, {"exclusiveMaximum", 0.25}};
  const GrammarNetwork net = json_schema_grammar(s, JsonSyntax::Json);
  EXPECT_LT(net.edges.size(), 5000u);
  for (const char* ok : {"-1999999999999", "-1.5", "0"}) EXPECT_TRUE(derives(net, ok)) << ok;
  for (const char* bad : {"1", "0.5", "-"}) EXPECT_FALSE(derives(net, bad)) << bad;
}

TEST(ConstrainSchema, EnumConstCombinatorsRefs) {
  EXPECT_TRUE(valid({{"enum", {"a", 1, nullptr}}}, "1"));
  EXPECT_FALSE(valid({{"enum", {"a", 1, nullptr}}}, "2"));
  EXPECT_TRUE(valid({{"enum", {"a", 1}}, {"type", "string"}}, "\"a\""));
  EXPECT_FALSE(valid({{"enum", {"a", 1}}, {"type", "string"}}, "1"));
  EXPECT_TRUE(valid({{"const", {{"k", {1, 2}}}}}, "{\"k\":[1,2]}"));
  json any = {{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 1}}}}};
  EXPECT_TRUE(valid(any, "3"));
  EXPECT_FALSE(valid(any, "\"ab\""));
  json one = {{"oneOf", {{{"type", "null"}}, {{"type", "boolean"}}}}};
  EXPECT_TRUE(valid(one, "true"));
  json tree = {{"$defs", {{"node", {{"type", "object"}, {"properties", {{"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}}}}}},
               {"$ref", "#/$defs/node"}};
  EXPECT_TRUE(valid(tree, "{\"kids\":[{\"kids\":[]},{}]}"));
  json old = {{"definitions", {{"n", {{"type", "integer"}}}}}, {"allOf", {{{"$ref", "#/definitions/n"}}}}};
  EXPECT_TRUE(valid(old, "4"));
  json self = {{"type", "array"}, {"items", {{"$ref", "#"}}}, {"maxItems", 2}};
  EXPECT_TRUE(valid(self, "[[],[[]]]"));
  EXPECT_TRUE(valid({{"title", "t"}, {"description", "d"}, {"default", 1}, {"examples", {1}}, {"type", "integer"}}, "1"));
}

TEST(ConstrainSchema, GemmaCallSyntax) {
  json s = {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}, {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
            {"required", {"city", "days"}}};
  EXPECT_TRUE(gemma(s, "{city:\x01Paris \"x\"\x01,days:3}"));
  EXPECT_TRUE(gemma(s, "{city:\x01P\x01,days:3,tags:[\x01" "a\x01,\x01" "b\x01]}"));
  EXPECT_FALSE(gemma(s, "{days:3,city:\x01P\x01}"));  // sorted keys, as the template dictsorts
  EXPECT_FALSE(gemma(s, "{city:\"P\",days:3}"));      // strings need <|"|>
  EXPECT_FALSE(gemma(s, "{\"city\":\x01P\x01,days:3}"));
  auto calls = tool_calls_grammar({{"get_weather", "", s}, {"noop", "", json::object()}}, true);
  GrammarMatcher m(std::make_shared<CompiledGrammar>(calls, demo_vocab()), {});
  EXPECT_TRUE(m.accept_token(48));
  EXPECT_TRUE(m.accept_bytes("call:noop{}"));
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.accept_token(49));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.is_terminated());  // parallel: another call may follow
  EXPECT_TRUE(m.accept_token(48));
  EXPECT_FALSE(m.accept_bytes("call:other{}"));
}

void expect_schema_error(const json& schema, const std::string& keyword, const std::string& pointer,
                         const std::string& message = "") {
  try {
    json_schema_grammar(schema, JsonSyntax::Json);
    ADD_FAILURE() << "accepted " << schema.dump();
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword(), keyword) << e.what();
    EXPECT_EQ(e.pointer(), pointer) << e.what();
    EXPECT_NE(std::string(e.what()).find(keyword), std::string::npos) << e.what();
    if (!message.empty()) {
      EXPECT_EQ(e.what(), message);
    }
  }
}

TEST(ConstrainSchema, UnsupportedKeywordsAndImpossibleSchemasNameKeywordAndPointer) {
  expect_schema_error({{"type", "object"}, {"properties", {{"x", {{"patternProperties", json::object()}}}}}},
                      "patternProperties", "/properties/x",
                      "unsupported JSON Schema keyword \"patternProperties\" at /properties/x");
  expect_schema_error({{"not", json::object()}}, "not", "");
  expect_schema_error({{"items", {{"contains", json::object()}}}}, "contains", "/items");
  expect_schema_error({{"prefixItems", {json::object(), {{"if", true}}}}}, "if", "/prefixItems/1");
  expect_schema_error({{"type", "array"}, {"uniqueItems", true}}, "uniqueItems", "");
  expect_schema_error({{"type", "string"}, {"format", "ipv4"}}, "format", "");
  expect_schema_error({{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}, "minItems", "");
  expect_schema_error({{"type", "string"}, {"minLength", 3}, {"maxLength", 2}}, "minLength", "");
  expect_schema_error({{"type", "integer"}, {"minimum", 3}, {"maximum", 2}}, "minimum", "");
  expect_schema_error({{"enum", {1}}, {"type", "string"}}, "enum", "");
  expect_schema_error({{"$ref", "#/$defs/none"}}, "$ref", "");
  expect_schema_error({{"$ref", "https://example.com/s.json"}}, "$ref", "");
  expect_schema_error({{"type", "strnig"}}, "type", "");
  expect_schema_error({{"properties", {{"a", {{"type", "string"}, {"pattern", "(?!x)"}}}}}}, "pattern", "/properties/a");
  expect_schema_error({{"type", "object"}, {"required", {"z"}}, {"additionalProperties", false}}, "required", "");
  expect_schema_error(false, "false", "");
}

}  // namespace
}  // namespace qs
