// The grammar engine's pieces: grammar builder, regex subset, JSON Schema compiler (every keyword accepts what it
// should and refuses what it should; errors name keyword and pointer), on the demo tokenizer's vocabulary.
// The external check of the same (jsonschema on random walks) is tests/constrain/run_constrained_outputs_test.sh.
#include <gtest/gtest.h>

#include <random>

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
// Ordered: a schema written as a braced list keeps its keys in the order written (a `json` converts, sorted).
bool valid(const nlohmann::ordered_json& schema, std::string_view text) {
  return derives(json_schema_grammar(schema, JsonSyntax::Json), text);
}
bool gemma(const nlohmann::ordered_json& schema, std::string_view text) {
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

// response_format beside tools under tool_choice auto: the JSON answer, or calls, nothing else.
TEST(ConstrainSchema, JsonOrToolCalls) {
  const json params = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
  const nlohmann::ordered_json verdict = {
      {"type", "object"}, {"properties", {{"sunny", {{"type", "boolean"}}}}}, {"required", {"sunny"}}};
  const std::vector<ToolSpec> tools = {{"get_weather", "", params}};
  for (const bool any_object : {false, true}) {
    const GrammarNetwork net = json_or_tool_calls_grammar(any_object ? nullptr : &verdict, tools, true);
    EXPECT_TRUE(derives(net, "{\"sunny\":true}"));
    EXPECT_EQ(derives(net, "{\"x\":1}"), any_object);
    EXPECT_FALSE(derives(net, "It is sunny."));
    GrammarMatcher m(std::make_shared<CompiledGrammar>(net, demo_vocab()), {});
    EXPECT_TRUE(m.accept_token(48) && m.accept_bytes("call:get_weather{city:") && m.accept_token(52) &&
                m.accept_bytes("Bath") && m.accept_token(52) && m.accept_bytes("}") && m.accept_token(49));
    EXPECT_TRUE(m.is_complete());
    EXPECT_FALSE(m.accept_bytes("{"));  // calls, then no JSON after them
  }
  EXPECT_THROW(json_or_tool_calls_grammar(&verdict, {{"", "", params}}, true), SchemaError);
}

// A weak model wrote "age" before the schema's first property "name". JSON output keeps the declared
// order (OpenAI's strict mode and llama.cpp's json-schema-to-grammar do): optional properties may be skipped, never
// moved. Gemma's call syntax keeps the sorted order its chat template writes (dictsort), what the model saw.
TEST(ConstrainSchema, PropertiesInDeclaredOrder) {
  const nlohmann::ordered_json s = {
      {"type", "object"},
      {"properties", {{"name", {{"type", "string"}}}, {"age", {{"type", "integer"}}}, {"city", {{"type", "string"}}}}},
      {"required", {"name", "age"}}};
  EXPECT_TRUE(valid(s, "{\"name\":\"Ann\",\"age\":4,\"city\":\"Oslo\"}"));
  EXPECT_TRUE(valid(s, "{\"name\":\"Ann\", \"age\":4}"));               // an optional property left out
  EXPECT_FALSE(valid(s, "{\"age\":4,\"name\":\"Ann\"}"));               // the report's output
  EXPECT_FALSE(valid(s, "{\"name\":\"Ann\",\"city\":\"Oslo\",\"age\":4}"));
  // Required names that no property declares follow the properties, in the order listed.
  const nlohmann::ordered_json extra = {{"type", "object"}, {"properties", {{"z", {{"type", "integer"}}}}},
                                        {"required", {"z", "y", "b"}}, {"additionalProperties", {{"type", "integer"}}}};
  EXPECT_TRUE(valid(extra, "{\"z\":1,\"y\":2,\"b\":3}"));
  EXPECT_FALSE(valid(extra, "{\"z\":1,\"b\":3,\"y\":2}"));
  // Gemma call syntax: sorted, whatever the declared order.
  EXPECT_TRUE(gemma(s, "{age:4,city:\x01O\x01,name:\x01" "A\x01}"));
  EXPECT_FALSE(gemma(s, "{name:\x01" "A\x01,age:4}"));
  // The tool-call grammar (ToolSpec parameters) is sorted too.
  auto calls = tool_calls_grammar({{"f", "", json(s)}}, false);
  GrammarMatcher m(std::make_shared<CompiledGrammar>(calls, demo_vocab()), {});
  EXPECT_TRUE(m.accept_token(48) && m.accept_bytes("call:f{age:1,name:") && m.accept_token(52));
}

// A weak model's `{"age": 46000000000...` ran to max_tokens while literals were unbounded. Integers fit 64 bits (at
// most 19 digits, no leading zero); numbers have at most 15 integer digits, 15 fraction digits and 2 exponent
// digits, so a double holds them.
TEST(ConstrainSchema, NumberLiteralsAreBounded) {
  const json integer = {{"type", "integer"}};
  for (const char* ok : {"0", "-7", "9223372036854775806", "-9223372036854775806", "1000000000000000000"})
    EXPECT_TRUE(valid(integer, ok)) << ok;
  for (const char* bad : {"92233720368547758070", "10000000000000000000", "9223372036854775808", "007", "-0"})
    EXPECT_FALSE(valid(integer, bad)) << bad;
  const json number = {{"type", "number"}};
  for (const char* ok : {"999999999999999", "-0.5", "0.123456789012345", "1.5e99", "-2E-7", "12"})
    EXPECT_TRUE(valid(number, ok)) << ok;
  for (const char* bad : {"1000000000000000", "0.1234567890123456", "1e100", "1e", "01.5"})
    EXPECT_FALSE(valid(number, bad)) << bad;
  // One bound: the other side gets the literal's own limit.
  EXPECT_TRUE(valid({{"type", "integer"}, {"minimum", 0}}, "9223372036854775806"));
  EXPECT_FALSE(valid({{"type", "integer"}, {"minimum", 0}}, "92233720368547758060"));
  EXPECT_TRUE(valid({{"type", "number"}, {"maximum", 0}}, "-999999999999999.5"));
  EXPECT_FALSE(valid({{"type", "number"}, {"maximum", 0}}, "-9999999999999999"));
  EXPECT_FALSE(valid({{"type", "number"}, {"minimum", 0}}, "1.0000000000000001"));  // 16 fraction digits
  EXPECT_TRUE(valid({{"type", "number"}, {"minimum", 1e16}}, "10000000000000000.5"));  // past the limit: still valid
  // Bounds beyond 64 bits are clamped to it.
  EXPECT_TRUE(valid({{"type", "integer"}, {"minimum", -1e30}, {"maximum", 1e30}}, "-9223372036854775806"));
  EXPECT_FALSE(valid({{"type", "integer"}, {"minimum", -1e30}, {"maximum", 1e30}}, "10000000000000000000"));
}

// A string without maxLength can close after every whole character, so that its closing quote is always among the
// tokens the mask allows.
TEST(ConstrainSchema, StringsWithoutMaxLengthCanAlwaysClose) {
  const auto grammar = std::make_shared<CompiledGrammar>(json_schema_grammar(json{{"type", "string"}}, JsonSyntax::Json),
                                                         demo_vocab());
  const int32_t quote = 497;  // the demo tokenizer's `"`
  ASSERT_EQ(demo_vocab()->token_bytes(quote), "\"");
  std::mt19937 rng(5);
  std::vector<uint64_t> mask((demo_vocab()->vocab_size() + 63) / 64);
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher m(grammar, {});
    ASSERT_TRUE(m.accept_bytes("\""));
    for (int step = 0; step < 40; ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < demo_vocab()->vocab_size(); ++id)
        if ((mask[id >> 6] >> (id & 63)) & 1 && id != static_cast<size_t>(quote)) allowed.push_back(static_cast<int32_t>(id));
      // Inside an escape or a UTF-8 sequence (where "z" cannot follow) the quote waits for the character to end;
      // everywhere else it is allowed and closes the string.
      GrammarMatcher probe = m, closing = m;
      if (probe.accept_bytes("z")) {
        EXPECT_TRUE((mask[quote >> 6] >> (quote & 63)) & 1) << "walk " << walk << " step " << step;
        ASSERT_TRUE(closing.accept_token(quote));
        EXPECT_TRUE(closing.is_complete());
      }
      ASSERT_FALSE(allowed.empty());
      ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
      if (m.is_complete()) break;  // a token such as `a"` closed the string
    }
  }
}

// Every token sequence the masks allow through a schema without unbounded strings or arrays reaches a complete
// document within the byte length its longest document has, whatever tokens are picked: a model, weak or not,
// cannot run away. Walks pick uniformly among the allowed tokens and never the end while anything else is allowed.
TEST(ConstrainSchema, BoundedSchemasEndWhateverTokensArePicked) {
  // Longest documents, from the literal limits: integer 20 bytes ("-" and 19 digits), number 35 ("-", 15 digits,
  // ".", 15 digits, "e-", 2 digits), boolean 5, a string of maxLength 4 2 + 4 * 6 (each character at most a \uXXXX
  // escape), ", " between members and ": " after keys.
  const nlohmann::ordered_json person = {
      {"type", "object"},
      {"properties", {{"name", {{"type", "string"}, {"maxLength", 4}}}, {"age", {{"type", "integer"}}},
                      {"score", {{"type", "number"}}}, {"ok", {{"type", "boolean"}}},
                      {"tag", {{"enum", {"red", "green"}}}},
                      {"at", {{"type", "object"}, {"properties", {{"x", {{"type", "number"}}}, {"y", {{"type", "integer"}}}}},
                              {"required", {"x", "y"}}, {"additionalProperties", false}}}}},
      {"required", {"name", "age", "score"}},
      {"additionalProperties", false}};
  const size_t at = 2 + (3 + 2 + 35) + 2 + (3 + 2 + 20);                  // {"x": N, "y": I}
  const size_t longest = 2 + (6 + 2 + 26) + 2 + (5 + 2 + 20) + 2 + (7 + 2 + 35) + 2 + (4 + 2 + 5) + 2 +
                         (5 + 2 + 7) + 2 + (4 + 2 + at);
  const auto grammar = std::make_shared<CompiledGrammar>(json_schema_grammar(person, JsonSyntax::Json), demo_vocab());
  const int32_t end = 1;
  std::vector<uint64_t> mask((demo_vocab()->vocab_size() + 63) / 64);
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    GrammarMatcher m(grammar, {end});
    std::string text;
    for (;;) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < demo_vocab()->vocab_size(); ++id)
        if ((mask[id >> 6] >> (id & 63)) & 1 && id != static_cast<size_t>(end)) allowed.push_back(static_cast<int32_t>(id));
      if (allowed.empty()) break;
      const int32_t id = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(id));
      text += demo_vocab()->token_bytes(id);
      ASSERT_LE(text.size(), longest) << "seed " << seed << ": " << text;
    }
    EXPECT_TRUE(m.is_complete()) << "seed " << seed << ": " << text;
    EXPECT_TRUE(text.starts_with("{\"name\":")) << text;
  }
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
