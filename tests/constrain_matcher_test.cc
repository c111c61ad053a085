// Token masks: the trie walk allows exactly the tokens whose bytes keep a valid prefix (checked token by token),
// special tokens only where the grammar names them, end tokens only where the document is complete; on the demo
// tokenizer and, when ../shared has it, the real 262,144-token Gemma 4 vocabulary. Then the engine: constrained
// output, batch invariance beside an unconstrained request, errors at submit, starts after thinking and at a tool call.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "checkpoint_tools/synth.h"
#include "constrain/grammar_cache.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "engine_events.h"

namespace qs {
namespace {

using test::Collected;

using json = nlohmann::json;
const std::string kSource = QATSERVE_SOURCE_DIR;

bool has(const std::vector<uint64_t>& mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

std::vector<uint64_t> mask_of(GrammarMatcher& m, size_t vocab) {
  std::vector<uint64_t> mask((vocab + 63) / 64);
  m.fill_mask(mask);
  return mask;
}

// Every id's bit equals whether accepting that token succeeds from the same position.
void expect_mask_matches_acceptance(const GrammarMatcher& m, const VocabIndex& vocab, size_t stride = 1) {
  GrammarMatcher probe = m;
  const auto mask = mask_of(probe, vocab.vocab_size());
  for (size_t id = 0; id < vocab.vocab_size(); id += stride) {
    GrammarMatcher copy = m;
    const bool accepted = copy.accept_token(static_cast<int32_t>(id)) || (copy.is_end_token(id) && m.is_complete());
    ASSERT_EQ(has(mask, static_cast<int32_t>(id)), accepted) << "token " << id << " bytes \"" << vocab.token_bytes(id) << "\"";
  }
}

class ConstrainMatcherDemo : public ::testing::Test {
 protected:
  Tokenizer tok_ = Tokenizer::load(kSource + "/configs/demo-tokenizer/tokenizer.json");
  GrammarCache cache_{tok_, tok_.vocab_size()};
  ConstraintSpec schema(json s) {
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::JsonSchema;
    spec.schema = std::move(s);
    return spec;
  }
};

TEST_F(ConstrainMatcherDemo, MaskIsExactlyTheAcceptedTokens) {
  auto m = cache_.matcher(schema({{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}, {"n", {{"type", "integer"}}}}}}), {1, 106});
  for (std::string_view prefix : {"", "{\"n\":", "{\"n\": 12", "{\"n\":1,\"name\":\"ab", "{\"n\":1,\"name\":\"ab\"}"}) {
    GrammarMatcher at = *m;
    ASSERT_TRUE(at.accept_bytes(prefix)) << prefix;
    expect_mask_matches_acceptance(at, cache_.vocab());
  }
}

TEST_F(ConstrainMatcherDemo, SpecialTokensOnlyWhereNamedEndOnlyWhenComplete) {
  auto m = cache_.matcher(schema({{"type", "string"}}), {1, 106});
  auto mask = mask_of(*m, tok_.vocab_size());
  EXPECT_FALSE(has(mask, 106)) << "<turn|> before the document is complete";
  ASSERT_TRUE(m->accept_bytes("\"a"));
  mask = mask_of(*m, tok_.vocab_size());
  for (int32_t special : {1, 2, 52, 105, 106}) EXPECT_FALSE(has(mask, special)) << special;  // never text
  ASSERT_TRUE(m->accept_bytes("\""));
  EXPECT_TRUE(m->is_terminated());
  mask = mask_of(*m, tok_.vocab_size());
  EXPECT_TRUE(has(mask, 1) && has(mask, 106));
  EXPECT_EQ(std::count_if(mask.begin(), mask.end(), [](uint64_t w) { return w != 0; }), 2);  // ids 1 and 106 only

  ConstraintSpec calls;
  calls.kind = ConstraintSpec::Kind::ToolCalls;
  calls.tools = {{"f", "", {{"type", "object"}, {"properties", {{"s", {{"type", "string"}}}}}, {"required", {"s"}}}}};
  calls.parallel_calls = false;
  auto c = cache_.matcher(calls, {106});
  EXPECT_TRUE(has(mask_of(*c, tok_.vocab_size()), 48));
  ASSERT_TRUE(c->accept_token(48));
  ASSERT_TRUE(c->accept_bytes("call:f{s:"));
  mask = mask_of(*c, tok_.vocab_size());
  EXPECT_TRUE(has(mask, 52));
  EXPECT_FALSE(has(mask, tok_.token_id("\"").value()));
  ASSERT_TRUE(c->accept_token(52));
  expect_mask_matches_acceptance(*c, cache_.vocab());
  ASSERT_TRUE(c->accept_bytes("x y"));
  ASSERT_TRUE(c->accept_token(52));
  ASSERT_TRUE(c->accept_bytes("}"));
  ASSERT_TRUE(c->accept_token(49));
  EXPECT_TRUE(c->is_terminated());  // one call only
}

TEST_F(ConstrainMatcherDemo, RepeatedSchemaCompilesOnce) {
  const json s = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  auto a = cache_.get(schema(s)), b = cache_.get(schema(s));
  EXPECT_EQ(a, b);
  EXPECT_EQ(cache_.compiled_count(), 1u);
  EXPECT_THROW(cache_.get(schema({{"type", "object"}, {"minProperties", 1}})), SchemaError);
}

TEST(ConstrainMatcherGemma4, RealVocabularyMasks) {
  const std::filesystem::path path = kSource + "/../shared/tokenizer/gemma4/tokenizer.reconstructed.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent (the real Gemma 4 vocabulary)";
  const Tokenizer tok = Tokenizer::load(path);
  GrammarCache cache(tok, tok.vocab_size());
  ASSERT_EQ(cache.vocab().vocab_size(), 262144u);
  EXPECT_EQ(cache.vocab().token_bytes(tok.token_id("▁the").value()), " the");
  EXPECT_EQ(cache.vocab().token_bytes(tok.token_id("<0x0A>").value_or(tok.token_id("\n").value())), "\n");
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonObject;
  auto m = cache.matcher(spec, {1, 106});
  auto mask = mask_of(*m, 262144);
  EXPECT_TRUE(has(mask, tok.token_id("{").value()));
  EXPECT_FALSE(has(mask, tok.token_id("[").value()));
  ASSERT_TRUE(m->accept_bytes("{\"k\": \"v"));
  expect_mask_matches_acceptance(*m, cache.vocab(), 7);  // every 7th id: the whole vocabulary is slow unoptimised
  mask = mask_of(*m, 262144);
  for (int32_t special : {1, 48, 52, 101, 106}) EXPECT_FALSE(has(mask, special)) << special;
}

// --- engine ------------------------------------------------------------------------------------------------------

class ConstrainEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Gemma4Model::load(test::synth_quietly({.preset = "e2b-tiny", .out = tmp_ / "m"}), Precision::F32);
  }
  EngineRequest request(uint64_t seed, int64_t max_tokens = 200) {
    EngineRequest r;
    r.prompt = tok_.encode("<bos>say it in JSON");
    r.max_tokens = max_tokens;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    return r;
  }
  static ConstraintSpec person() {
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::JsonSchema;
    spec.schema = {{"type", "object"},
                   {"properties", {{"name", {{"type", "string"}, {"maxLength", 8}}}, {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}}},
                   {"required", {"name", "age"}}};
    return spec;
  }
  test::TempDir tmp_;
  std::unique_ptr<Gemma4Model> model_;
  Tokenizer tok_ = Tokenizer::load(kSource + "/configs/demo-tokenizer/tokenizer.json");
  GenerationConfig generation_{.eos_token_ids = {1, 106}};
};

TEST_F(ConstrainEngine, ConstrainedOutputBesideUnconstrainedIsValidAndChangesNothingElse) {
  Engine engine(*model_, &tok_, generation_, {.max_running = 4});
  Collected free_alone, free_batched, constrained[3];
  ASSERT_EQ(engine.submit(request(7, 24), free_alone.sink()).status, SubmitStatus::Accepted);
  free_alone.wait();
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = request(100 + i);
    r.constraint = person();
    ASSERT_EQ(engine.submit(std::move(r), constrained[i].sink()).status, SubmitStatus::Accepted);
  }
  ASSERT_EQ(engine.submit(request(7, 24), free_batched.sink()).status, SubmitStatus::Accepted);
  free_batched.wait();
  EXPECT_EQ(free_batched.tokens, free_alone.tokens);
  for (auto& c : constrained) {
    c.wait();
    ASSERT_EQ(c.reason, "stop") << c.text;
    const json doc = json::parse(c.text);
    EXPECT_TRUE(doc.contains("name") && doc["name"].is_string() && doc["name"].get<std::string>().size() <= 8 * 4) << c.text;
    EXPECT_TRUE(doc["age"].is_number_integer() && doc["age"].get<int>() >= 0 && doc["age"].get<int>() <= 99) << c.text;
  }
}

TEST_F(ConstrainEngine, BadSchemaIsRefusedAtSubmit) {
  Engine engine(*model_, &tok_, generation_, {});
  EngineRequest r = request(1);
  r.constraint.kind = ConstraintSpec::Kind::JsonSchema;
  r.constraint.schema = {{"type", "object"}, {"properties", {{"x", {{"patternProperties", json::object()}}}}}};
  Collected c;
  SubmitResult res = engine.submit(std::move(r), c.sink());
  EXPECT_EQ(res.status, SubmitStatus::Invalid);
  EXPECT_EQ(res.error, "unsupported JSON Schema keyword \"patternProperties\" at /properties/x");
  Engine no_tokenizer(*model_, nullptr, generation_, {});
  EngineRequest r2 = request(1);
  r2.constraint = person();
  EXPECT_EQ(no_tokenizer.submit(std::move(r2), c.sink()).status, SubmitStatus::Invalid);
}

TEST_F(ConstrainEngine, AfterThinkingStartsAtChannelEnd) {
  // A strong bias makes the free (thinking) part write <channel|> first; the grammar then masks it like any token
  // JSON does not allow.
  Engine engine(*model_, &tok_, generation_, {});
  EngineRequest r = request(5);
  r.constraint = person();
  r.constraint.start = ConstraintSpec::Start::AfterThinking;
  r.sampling.logit_bias = {{101, 1000.0f}};
  Collected c;
  ASSERT_EQ(engine.submit(std::move(r), c.sink()).status, SubmitStatus::Accepted);
  c.wait();
  ASSERT_EQ(c.reason, "stop");
  ASSERT_FALSE(c.tokens.empty());
  EXPECT_EQ(c.tokens[0], 101);
  EXPECT_EQ(std::count(c.tokens.begin(), c.tokens.end(), 101), 1);
  EXPECT_NO_THROW(json::parse(c.text)) << c.text;  // the decoder drops the special token from the text
}

// tool_choice auto: the text is free until the model opens a call; from `<|tool_call>` (here the first token, by a
// bias) the call names a declared tool with valid arguments, and without parallel calls the output ends after it.
// A tool the grammar cannot compile leaves the calls free instead of refusing the request.
TEST_F(ConstrainEngine, ToolCallGrammarStartsWhenTheModelOpensACall) {
  Engine engine(*model_, &tok_, generation_, {});
  ConstraintSpec calls;
  calls.kind = ConstraintSpec::Kind::ToolCalls;
  calls.tools = {{"get_weather", "",
                  {{"type", "object"},
                   {"properties", {{"city", {{"type", "string"}, {"maxLength", 8}}}}},
                   {"required", {"city"}}}}};
  calls.parallel_calls = false;
  calls.start = ConstraintSpec::Start::AtToolCall;
  for (uint64_t seed : {5, 6, 7}) {
    EngineRequest r = request(seed);
    r.constraint = calls;
    r.sampling.logit_bias = {{48, 1000.0f}};
    Collected c;
    ASSERT_EQ(engine.submit(std::move(r), c.sink()).status, SubmitStatus::Accepted);
    c.wait();
    ASSERT_EQ(c.reason, "stop");
    const std::string text = tok_.decode(c.tokens);
    EXPECT_EQ(text.rfind("<|tool_call>call:get_weather{city:<|\"|>", 0), 0u) << text;
    EXPECT_TRUE(text.ends_with("<|\"|>}<tool_call|>")) << text;
  }

  // Unopened, the grammar never masks: the same draws as the request without it.
  Collected free, lazy;
  ASSERT_EQ(engine.submit(request(9, 24), free.sink()).status, SubmitStatus::Accepted);
  free.wait();
  ASSERT_EQ(std::count(free.tokens.begin(), free.tokens.end(), 48), 0);  // this seed opens no call
  EngineRequest r = request(9, 24);
  r.constraint = calls;
  ASSERT_EQ(engine.submit(std::move(r), lazy.sink()).status, SubmitStatus::Accepted);
  lazy.wait();
  EXPECT_EQ(lazy.tokens, free.tokens);

  calls.tools[0].parameters = {{"type", "object"}, {"patternProperties", json::object()}};
  EngineRequest unsupported = request(9, 24);
  unsupported.constraint = calls;
  Collected u;
  ASSERT_EQ(engine.submit(std::move(unsupported), u.sink()).status, SubmitStatus::Accepted);
  u.wait();
  EXPECT_EQ(u.tokens, free.tokens);
}

TEST_F(ConstrainEngine, GeneratorCarriesTheConstraint) {
  Generator gen(*model_, &tok_, generation_);
  GenerationRequest g;
  g.prompt = request(0).prompt;
  g.max_tokens = 200;
  g.sampling.temperature = 0.7f;
  g.sampling.seed = 3;
  g.constraint = person();
  GenerationResult r = gen.run(g);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_TRUE(json::parse(r.text).contains("age")) << r.text;
}

}  // namespace
}  // namespace qs

namespace qs {
namespace {

// A pool with room for about one and a half sequences: constrained sequences are preempted and recompute their
// prompt and output, and the matcher (advanced once per sampled token, never by prefill) must carry on as if
// nothing happened: each output equals the one it gets running alone.
TEST_F(ConstrainEngine, PreemptedConstrainedSequencesContinueExactly) {
  const KvLayout layout = model_->kv_layout(4);
  const uint64_t bytes = 15 * layout.block_bytes(KvClass::Full) + 8 * layout.block_bytes(KvClass::Sliding);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = request(40 + i, 36);
    r.constraint = person();
    r.ignore_eos = true;  // ends when the grammar does, or at max_tokens
    reqs.push_back(std::move(r));
  }
  std::vector<std::vector<int32_t>> solo;
  for (const auto& r : reqs) {
    Engine alone(*model_, &tok_, generation_, {.max_running = 1, .max_context = 48});
    Collected c;
    ASSERT_EQ(alone.submit(r, c.sink()).status, SubmitStatus::Accepted);
    c.wait();
    solo.push_back(c.tokens);
  }
  std::vector<Collected> got(reqs.size());
  Engine engine(*model_, &tok_, generation_,
                {.max_running = 4, .prefill_chunk = 8, .max_context = 48, .kv_bytes = bytes, .kv_block_size = 4});
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(engine.submit(reqs[i], got[i].sink()).status, SubmitStatus::Accepted);
  for (size_t i = 0; i < reqs.size(); ++i) {
    got[i].wait();
    EXPECT_EQ(got[i].tokens, solo[i]) << "request " << i;
  }
  EXPECT_GT(engine.stats().preemptions, 0u);
}

}  // namespace
}  // namespace qs
