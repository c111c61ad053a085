// engine/media_prompt and the engine's media spans against transformers' goldens (tests/fixtures/mm_e2b_like, made
// by tools/python/make_multimodal_fixtures.py): the processor's input ids from the fixture's PNG/WAV bytes, greedy
// tokens with the prompt cut into small prefill chunks (a span is never split), and prefix-cache keys that see the
// media's content.

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "engine/engine.h"
#include "engine/media_cache.h"
#include "engine/media_prompt.h"
#include "formats/safetensors.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/file.h"
#include "engine_events.h"

namespace qs {
namespace {

using test::Collected;

const std::string kFixture = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/mm_e2b_like/";

struct Loaded {
  std::unique_ptr<Gemma4Model> model;
  Tokenizer tokenizer;
  MediaTowers towers;
  SafetensorsFile reference;
};

Loaded load() {
  auto model = Gemma4Model::load(kFixture + "bf16", Precision::F32);
  Tokenizer tokenizer = Tokenizer::load(kFixture + "bf16/tokenizer.json");
  MediaTowers towers = MediaTowers::load(*model, kFixture + "bf16");
  return {std::move(model), std::move(tokenizer), std::move(towers),
          SafetensorsFile::open(kFixture + "reference.safetensors")};
}

media::MediaInput media_file(media::MediaKind kind, const std::string& file) {
  return {kind, read_file(kFixture + "media/" + file), file.substr(file.rfind('.') + 1), "media " + file};
}

// A case's prompt as meta.json writes it (the chat template's text, one marker per item) with its media.
MediaPrompt case_prompt(const Loaded& l, const std::string& text, const std::vector<media::MediaInput>& media) {
  return expand_media_prompt(l.tokenizer.encode(text), media, l.towers, l.tokenizer);
}

const std::string kImageOdd =
    "<bos><|turn>user\n\n\n<|image|>\n\nDescribe this.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
const std::string kAudioImage =
    "<bos><|turn>user\n\n\n<|image|>\n\n<|audio|>Both?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";

EngineRequest greedy_request(MediaPrompt prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt.tokens);
  r.media = std::move(prompt.spans);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;  // as the goldens were generated
  return r;
}

std::vector<int32_t> run(Engine& engine, EngineRequest r) {
  Collected got;
  SubmitResult s = engine.submit(std::move(r), got.sink());
  EXPECT_EQ(s.status, SubmitStatus::Accepted) << s.error;
  if (s.status != SubmitStatus::Accepted) return {};
  got.wait();
  return got.tokens;
}

TEST(MediaPrompt, TokensAreTheProcessorsFromTheBytes) {
  Loaded l = load();
  MediaPrompt p = case_prompt(l, kAudioImage, {media_file(media::MediaKind::Image, "square_50x50.png"),
                                               media_file(media::MediaKind::Audio, "chirp_0.6s.wav")});
  EXPECT_EQ(p.tokens, test::read_tensor<int32_t>(l.reference, "audio_image.input_ids"));
  ASSERT_EQ(p.spans.size(), 2u);
  EXPECT_TRUE(p.spans[0].vision);
  EXPECT_FALSE(p.spans[1].vision);
}

// A request's image budget (MediaInput::image_soft_tokens) replaces the processor's 70 for that image: more soft
// tokens at 280, and another content key, so neither cache mixes the two (counts against transformers' processor:
// tests/server/test_image_budget.py).
TEST(MediaPrompt, AnImagesOwnBudgetIsItsSoftTokensAndKey) {
  Loaded l = load();
  media::MediaInput image = media_file(media::MediaKind::Image, "odd_45x71.png");
  media::MediaInput larger = image;
  larger.image_soft_tokens = 280;
  EXPECT_EQ(l.towers.image_soft_tokens(), 70);
  EXPECT_LE(l.towers.prepare(image)->soft_tokens(), 70);
  EXPECT_GT(l.towers.prepare(larger)->soft_tokens(), 70);
  EXPECT_LE(l.towers.prepare(larger)->soft_tokens(), 280);
  EXPECT_FALSE(media_key(image) == media_key(larger));
  EXPECT_TRUE(media_key(larger) == media_key(media::MediaInput(larger)));
}

// Prefill chunks of 16 positions: the image's 60 soft tokens cross three chunk boundaries unless kept whole.
TEST(MediaPrompt, GreedyWithSmallPrefillChunksIsTransformers) {
  Loaded l = load();
  Engine engine(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1, .prefill_chunk = 16});
  const std::vector<int32_t> golden = test::read_tensor<int32_t>(l.reference, "image_odd.greedy_f32");
  MediaPrompt p = case_prompt(l, kImageOdd, {media_file(media::MediaKind::Image, "odd_45x71.png")});
  EXPECT_EQ(run(engine, greedy_request(std::move(p), static_cast<int64_t>(golden.size()))), golden);
}

// The same image again adopts the cached blocks through it; another image (here: the same soft tokens, perturbed)
// adopts nothing past the text before it, and still gives what it gives alone.
TEST(MediaPrompt, PrefixCacheKeysSeeTheMedia) {
  Loaded l = load();
  const std::vector<media::MediaInput> image = {media_file(media::MediaKind::Image, "odd_45x71.png")};
  MediaPrompt first = case_prompt(l, kImageOdd, image);
  ASSERT_EQ(first.tokens.size(), 106u);
  const int64_t image_start = first.spans[0].first;
  MediaPrompt other = first;
  for (float& v : other.spans[0].embeddings) v *= 1.01f;
  other.spans[0].key.lo ^= 1;  // another image has another content key
  std::vector<int32_t> other_alone;
  {
    Engine fresh(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1});
    other_alone = run(fresh, greedy_request(other, 4));
  }
  // Prefill chunks shorter than the fixture's window of 8 (as the real models' are: engine_test.cc), but for the
  // image, which is one chunk.
  Engine engine(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1, .prefill_chunk = 3, .kv_block_size = 16});
  run(engine, greedy_request(first, 4));
  const int64_t hits0 = engine.stats().prefix_hit_tokens;
  run(engine, greedy_request(first, 4));
  const int64_t same = engine.stats().prefix_hit_tokens - hits0;
  EXPECT_EQ(same, 96);  // every complete block of the 106-token prompt but the one holding its last token
  EXPECT_EQ(run(engine, greedy_request(other, 4)), other_alone);
  EXPECT_EQ(engine.stats().prefix_hit_tokens - hits0 - same, image_start / 16 * 16);
}

// Spans given prepared (the server's way) are encoded by the engine at admission: the same greedy tokens as
// transformers'. The same image again, after other text (so the prefix cache holds none of it), comes from the
// media cache; with the cache off it goes through the tower again.
TEST(MediaPrompt, EngineEncodesPreparedSpansAndCachesThem) {
  Loaded l = load();
  const std::vector<int32_t> golden = test::read_tensor<int32_t>(l.reference, "image_odd.greedy_f32");
  const std::vector<media::MediaInput> image = {media_file(media::MediaKind::Image, "odd_45x71.png")};
  auto prepared = [&](const std::string& text) {
    MediaPrompt p = prepare_media_prompt(l.tokenizer.encode(text), image, l.towers, l.tokenizer);
    EXPECT_TRUE(p.spans.at(0).embeddings.empty());
    EXPECT_EQ(p.spans[0].count, 60);
    return p;
  };
  const std::string other_text = "<bos><|turn>system\nBe brief.<turn|>\n" + kImageOdd.substr(5);
  for (uint64_t cache_bytes : {uint64_t{1} << 20, uint64_t{0}}) {
    Engine engine(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1, .media_cache_bytes = cache_bytes},
                  &l.towers);
    EXPECT_EQ(run(engine, greedy_request(prepared(kImageOdd), static_cast<int64_t>(golden.size()))), golden);
    EXPECT_EQ(engine.stats().media_encodes, 1u);
    run(engine, greedy_request(prepared(other_text), 2));
    EXPECT_EQ(engine.stats().media_encodes, cache_bytes ? 1u : 2u);
    EXPECT_EQ(engine.stats().media_cache_hits, cache_bytes ? 1u : 0u);
  }
  // Without towers the engine refuses a span it cannot encode.
  Engine bare(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1});
  EXPECT_EQ(bare.submit(greedy_request(prepared(kImageOdd), 2), [](EngineEvent&&) { return true; }).status,
            SubmitStatus::Invalid);
}

// The sampler's repetition penalty counts the processor's prompt ids (placeholders included, as vLLM's prompt mask
// does), never the content ids that key the image's prefix-cache blocks: the engine's greedy tokens equal vLLM's
// rule (positive logits / penalty, negative x penalty, over every distinct prompt and output id) applied by hand
// to the model's own logits.
TEST(MediaPrompt, RepetitionPenaltySeesThePromptIdsNotTheMediaKeys) {
  Loaded l = load();
  MediaPrompt p = case_prompt(l, kImageOdd, {media_file(media::MediaKind::Image, "odd_45x71.png")});
  constexpr float kPenalty = 3.0f;
  constexpr int kTokens = 6;
  std::vector<int32_t> expected;
  {
    KvCache cache = l.model->new_cache(static_cast<int64_t>(p.tokens.size()) + kTokens);
    const std::vector<SoftTokens> soft = p.soft_tokens();
    std::vector<float> logits = l.model->forward_batch(std::vector{SequenceStep{p.tokens, &cache, LogitsWanted::Last, soft}});
    for (int t = 0; t < kTokens; ++t) {
      std::vector<bool> seen(logits.size());
      for (int32_t id : p.tokens) seen[id] = true;
      for (int32_t id : expected) seen[id] = true;
      for (size_t id = 0; id < logits.size(); ++id)
        if (seen[id]) logits[id] = logits[id] > 0 ? logits[id] / kPenalty : logits[id] * kPenalty;
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      expected.push_back(next);
      logits = l.model->forward_batch(std::vector{SequenceStep{std::span(&expected.back(), 1), &cache}});
    }
  }
  Engine engine(*l.model, &l.tokenizer, GenerationConfig{}, {.max_running = 1});
  EngineRequest r = greedy_request(std::move(p), kTokens);
  r.sampling.repetition_penalty = kPenalty;
  EXPECT_EQ(run(engine, std::move(r)), expected);
}

TEST(MediaPrompt, MediaCacheEvictsTheLeastRecentlyUsedWithinItsBytes) {
  MediaEmbeddingCache cache(3 * 4 * sizeof(float));
  const std::vector<float> four(4, 1.0f);
  for (uint64_t k = 1; k <= 3; ++k) cache.insert({0, k}, four);
  ASSERT_NE(cache.find({0, 1}), nullptr);  // 1 is now the most recently used
  cache.insert({0, 4}, four);              // evicts 2
  EXPECT_EQ(cache.find({0, 2}), nullptr);
  EXPECT_NE(cache.find({0, 1}), nullptr);
  EXPECT_NE(cache.find({0, 3}), nullptr);
  EXPECT_EQ(cache.find({1, 3}), nullptr);  // keys differ in either half
  cache.insert({0, 5}, std::vector<float>(13, 0.0f));  // larger than the budget: not stored
  EXPECT_EQ(cache.find({0, 5}), nullptr);
  EXPECT_EQ(cache.bytes(), 3 * 4 * sizeof(float));
  MediaEmbeddingCache off(0);
  off.insert({0, 1}, four);
  EXPECT_EQ(off.find({0, 1}), nullptr);
}

TEST(MediaPrompt, ErrorsNameThePart) {
  Loaded l = load();
  media::MediaInput bad{media::MediaKind::Image, "not an image", "png", "messages[0].content[1]"};
  try {
    case_prompt(l, kImageOdd, {bad});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages[0].content[1]"), std::string::npos) << e.what();
  }
  const std::vector<media::MediaInput> one = {media_file(media::MediaKind::Image, "odd_45x71.png")};
  EXPECT_THROW(case_prompt(l, "<|image|><|image|>", one), Error);  // a marker without its image
  EXPECT_THROW(case_prompt(l, "no marker", one), Error);           // an image without its marker
}

// The 12B's family reads media through its encoder-free embedders (what its config has of them); their soft tokens
// are held to transformers by gemma4_unified_embedders_test and ctest unified_multimodal_cli.
TEST(MediaPrompt, UnifiedModelReadsMediaThroughItsEmbedders) {
  const std::string fixtures = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/";
  auto model = Gemma4Model::load(fixtures + "mm_unified_like/bf16", Precision::F32);
  MediaTowers towers = MediaTowers::load(*model, fixtures + "mm_unified_like/bf16");
  EXPECT_TRUE(towers.images());
  EXPECT_TRUE(towers.audio());
  auto text_only = Gemma4Model::load(fixtures + "unified_like/bf16", Precision::F32);
  MediaTowers none = MediaTowers::load(*text_only, fixtures + "unified_like/bf16");
  EXPECT_FALSE(none.images());
  EXPECT_FALSE(none.audio());
}

}  // namespace
}  // namespace qs
