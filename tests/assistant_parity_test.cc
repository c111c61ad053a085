// Gemma 4 assistant drafters against transformers (the external reference): tiny random drafters beside the
// target fixtures, saved by transformers (bf16/) and packed by compressed-tensors (w4a16/), with each position's
// chain of 4 greedy drafts computed by transformers' Gemma4AssistantForCausalLM as
// SinglePositionMultiTokenCandidateGenerator drives it (tools/python/make_assistant_fixtures.py). Covered: the tied
// head and the ordered-embeddings head, a KV-sharing target (E2B-like) and one without sharing (26B-like, with
// attention_k_eq_v), sliding layers reading window + 1 positions of a 29-token prompt with window 8.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/gemma4.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/gemma4_assistant.h"
#include "test_util.h"
#include "util/error.h"
#include "util/file.h"

namespace qs {
namespace {

const std::string kFixtures = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/";
constexpr int64_t kDrafts = 4;

struct Reference {
  std::string target;
  std::vector<int32_t> tokens, ids_f32, ids_bf16, bf16_cluster_tie;
  std::vector<float> chain_f32, chain_bf16;
  int64_t vocab = 0;
};

Reference load_reference(const std::string& fixture) {
  SafetensorsFile f = SafetensorsFile::open(kFixtures + fixture + "/reference.safetensors");
  Reference r;
  r.target = nlohmann::json::parse(read_file(kFixtures + fixture + "/meta.json"))["target"].get<std::string>();
  r.tokens = test::read_tensor<int32_t>(f, "tokens");
  r.ids_f32 = test::read_tensor<int32_t>(f, "chain_ids_f32");
  r.ids_bf16 = test::read_tensor<int32_t>(f, "chain_ids_bf16");
  r.bf16_cluster_tie = test::read_tensor<int32_t>(f, "bf16_cluster_tie");
  r.chain_f32 = test::read_tensor<float>(f, "chain_f32");
  for (uint16_t b : test::read_tensor<uint16_t>(f, "chain_bf16")) r.chain_bf16.push_back(bf16_to_f32(b));
  r.vocab = f.find("chain_f32")->shape[2];
  return r;
}

// Worst |ours - reference| of each logits row over that row's peak |reference|.
float worst_relative(const float* ours, const float* ref, int64_t rows, int64_t vocab) {
  float worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float peak = 0, diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      peak = std::max(peak, std::fabs(ref[r * vocab + v]));
      diff = std::max(diff, std::fabs(ours[r * vocab + v] - ref[r * vocab + v]));
    }
    worst = std::max(worst, diff / peak);
  }
  return worst;
}

// The bar: f32 within 1e-5 of each row's peak |logit| (float reordering alone gives ~1e-6).
constexpr float kF32Relative = 1e-5f;

// `qatserve logits --assistant` on the fixture: assistant_chain [T, 4, vocab] and assistant_logits (its first
// drafts) against transformers, and the same drafts through AssistantDrafter-style calls (Gemma4Assistant::draft)
// on a cache that grows one position at a time, as speculative decoding uses it.
// Runs the target on tokens[t] and returns what the assistant is fed after it: tokens[t + 1], or the target's
// argmax after the last token; `hidden` receives the target's final-normed hidden state.
int32_t step_target(const Gemma4Model& target, const std::vector<int32_t>& tokens, int64_t t, KvCache& cache,
                    std::vector<float>& hidden) {
  SequenceStep step{std::span(&tokens[t], 1), &cache, LogitsWanted::Last, {}, 0, &hidden};
  const std::vector<float> logits = target.forward_batch(std::span(&step, 1));
  if (t + 1 < static_cast<int64_t>(tokens.size())) return tokens[t + 1];
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void expect_f32_chain(const std::string& fixture, const std::string& format) {
  const Reference r = load_reference(fixture);
  const int64_t T = r.tokens.size(), V = r.vocab;
  const std::string target_dir = kFixtures + r.target + "/" + format, dir = kFixtures + fixture + "/" + format;
  test::TempDir tmp;
  std::string ids;
  for (int32_t t : r.tokens) ids += std::to_string(t) + ",";
  ids.pop_back();
  const auto out = tmp / "logits.safetensors";
  test::CliResult run = test::qatserve("logits --model '" + target_dir + "' --assistant '" + dir + "' --tokens " + ids +
                                       " --out '" + out.string() + "' --precision f32");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  SafetensorsFile f = SafetensorsFile::open(out);
  const std::vector<float> chain = test::read_tensor<float>(f, "assistant_chain");
  const std::vector<float> first = test::read_tensor<float>(f, "assistant_logits");
  ASSERT_EQ(chain.size(), r.chain_f32.size());
  ASSERT_EQ(first.size(), static_cast<size_t>(T * V));
  const float worst = worst_relative(chain.data(), r.chain_f32.data(), T * kDrafts, V);
  EXPECT_LE(worst, kF32Relative) << fixture << "/" << format;
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(0, std::memcmp(first.data() + t * V, chain.data() + t * kDrafts * V, V * sizeof(float)))
        << "assistant_logits row " << t << " is not the chain's first draft";
    for (int64_t k = 0; k < kDrafts; ++k) {
      const float* row = chain.data() + (t * kDrafts + k) * V;
      EXPECT_EQ(std::max_element(row, row + V) - row, r.ids_f32[t * kDrafts + k]) << "row " << t << " draft " << k;
    }
  }
  std::printf("[ %s/%s ] f32 assistant_chain: worst |ours - transformers| = %.3g of the row's peak |logit|\n",
              fixture.c_str(), format.c_str(), worst);

  // The drafting API on a cache that keeps only what the drafter needs.
  auto target = Gemma4Model::load(target_dir, Precision::F32);
  auto assistant = Gemma4Assistant::load(dir, *target);
  KvCache cache = target->new_cache(T + 1, 0, assistant->sliding_kept());
  std::vector<float> hidden, logits;
  float worst_draft = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t next = step_target(*target, r.tokens, t, cache, hidden);
    const std::vector<int32_t> drafts = assistant->draft(hidden, next, cache, kDrafts, &logits);
    EXPECT_EQ(drafts, std::vector<int32_t>(r.ids_f32.begin() + t * kDrafts, r.ids_f32.begin() + (t + 1) * kDrafts))
        << "draft() after position " << t;
    EXPECT_EQ(assistant->draft(hidden, next, cache, kDrafts), drafts) << "draft() without logits, position " << t;
    worst_draft = std::max(worst_draft, worst_relative(logits.data(), r.chain_f32.data() + t * kDrafts * V, kDrafts, V));
  }
  EXPECT_LE(worst_draft, kF32Relative) << fixture << "/" << format << " draft()";
}

// bf16: within kBf16Ulps bf16 ulps of each row's peak |logit| of transformers' bf16 run, the same drafts. A chain
// is compared up to a draft whose bf16 centroid scores tie at the top-k cut in transformers' run (the fixture
// lists them): there torch.topk's tie order picks the cluster, and our f32 scores of a hidden state a rounding
// away may pick the other one.
constexpr float kBf16Ulps = 4;

void expect_bf16_chain(const std::string& fixture) {
  const Reference r = load_reference(fixture);
  const int64_t T = r.tokens.size(), V = r.vocab;
  auto target = Gemma4Model::load(kFixtures + r.target + "/bf16", Precision::BF16);
  auto assistant = Gemma4Assistant::load(kFixtures + fixture + "/bf16", *target);
  KvCache cache = target->new_cache(T + 1, 0, assistant->sliding_kept());
  std::vector<float> hidden, logits;
  float worst_ulps = 0;
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t next = step_target(*target, r.tokens, t, cache, hidden);
    const std::vector<int32_t> drafts = assistant->draft(hidden, next, cache, kDrafts, &logits);
    EXPECT_EQ(assistant->draft(hidden, next, cache, kDrafts), drafts) << "draft() without logits, position " << t;
    for (int64_t k = 0; k < kDrafts && !r.bf16_cluster_tie[t * kDrafts + k]; ++k, ++compared) {
      const float* ref = r.chain_bf16.data() + (t * kDrafts + k) * V;
      const float peak = std::fabs(*std::max_element(ref, ref + V, [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
      const float ulp = std::exp2(std::floor(std::log2(peak)) - 7);
      worst_ulps = std::max(worst_ulps, worst_relative(logits.data() + k * V, ref, 1, V) * peak / ulp);
      ASSERT_EQ(drafts[k], r.ids_bf16[t * kDrafts + k]) << fixture << " row " << t << " draft " << k;
    }
  }
  EXPECT_LE(worst_ulps, kBf16Ulps) << fixture;
  EXPECT_GE(compared, T * kDrafts * 3 / 4) << fixture << ": too few drafts compared";
  std::printf("[ %s ] bf16 drafts: worst %.3g bf16 ulps of the row's peak |logit| (%lld of %lld drafts compared)\n",
              fixture.c_str(), worst_ulps, static_cast<long long>(compared), static_cast<long long>(T * kDrafts));
}

TEST(AssistantParity, Bf16WithinTransformersBf16Error) {
  expect_bf16_chain("assistant_e2b_tied");
  expect_bf16_chain("assistant_e2b_ordered");
  expect_bf16_chain("assistant_moe_ordered");
}

TEST(AssistantParity, TiedHeadE2bLikeF32) {
  expect_f32_chain("assistant_e2b_tied", "bf16");
  expect_f32_chain("assistant_e2b_tied", "w4a16");
}

TEST(AssistantParity, OrderedEmbeddingsE2bLikeF32) {
  expect_f32_chain("assistant_e2b_ordered", "bf16");
  expect_f32_chain("assistant_e2b_ordered", "w4a16");
}

TEST(AssistantParity, OrderedEmbeddingsNoKvSharingTargetF32) {
  expect_f32_chain("assistant_moe_ordered", "bf16");
  expect_f32_chain("assistant_moe_ordered", "w4a16");
}

// Greedy decoding with the fixture drafters through the engine's speculative path gives exactly transformers' greedy
// continuation of the target (its fixture's greedy_f32, 32 tokens, no stop), whatever the drafts per step.
void expect_assisted_greedy(const std::string& fixture) {
  const Reference r = load_reference(fixture);
  SafetensorsFile f = SafetensorsFile::open(kFixtures + r.target + "/reference.safetensors");
  const std::vector<int32_t> greedy = test::read_tensor<int32_t>(f, "greedy_f32");
  auto target = Gemma4Model::load(kFixtures + r.target + "/bf16", Precision::F32);
  auto assistant = Gemma4Assistant::load(kFixtures + fixture + "/bf16", *target);
  const Generator generator(*target, nullptr, {}, nullptr, assistant.get());
  for (int64_t k : {1, 4, 7}) {
    GenerationRequest req;
    req.prompt = r.tokens;
    req.max_tokens = static_cast<int64_t>(greedy.size());
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    req.speculative = {SpeculativeMethod::Assistant, k};
    const GenerationResult out = generator.run(req);
    std::vector<int32_t> ids;
    for (const SampledToken& t : out.tokens) ids.push_back(t.id);
    EXPECT_EQ(ids, greedy) << fixture << " with " << k << " drafts per step";
    EXPECT_GT(out.draft_tokens, 0u) << fixture;
    std::printf("[ %s ] %lld drafts per step: %llu of %llu drafts accepted for %zu tokens\n", fixture.c_str(),
                static_cast<long long>(k), static_cast<unsigned long long>(out.accepted_tokens),
                static_cast<unsigned long long>(out.draft_tokens), ids.size());
  }
}

TEST(AssistantParity, AssistedGreedyIsTransformersGreedy) {
  expect_assisted_greedy("assistant_e2b_tied");
  expect_assisted_greedy("assistant_e2b_ordered");
  expect_assisted_greedy("assistant_moe_ordered");
}

// Each sequence's tokens, every request through one engine at once (continuous batching).
std::vector<std::vector<int32_t>> run_batch(const Gemma4Model& target, EngineOptions options,
                                            const std::vector<EngineRequest>& requests, EngineStats* stats) {
  Engine engine(target, nullptr, {}, options);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> tokens(requests.size());
  size_t finished = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SubmitResult r = engine.submit(requests[i], [&, i](EngineEvent&& e) {
      std::lock_guard lock(mu);
      for (const SampledToken& t : e.tokens) tokens[i].push_back(t.id);
      if (e.finished && ++finished == requests.size()) cv.notify_all();
      return true;
    });
    EXPECT_EQ(r.status, SubmitStatus::Accepted) << r.error;
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return finished == requests.size(); });
  *stats = engine.stats();
  return tokens;
}

// Several sequences decoding together, of different prompt lengths (past the fixture's sliding window of 8, so the
// assistant reads the positions its sliding_kept() keeps), with a small KV block size: greedy ids are identical with
// and without the assistant drafting, in bf16 and f32, whatever it proposes (the random drafter is mostly rejected).
TEST(AssistantParity, EngineGreedyIsIdenticalWithTheAssistantInABatch) {
  const Reference r = load_reference("assistant_e2b_tied");
  for (Precision precision : {Precision::F32, Precision::BF16}) {
    auto target = Gemma4Model::load(kFixtures + r.target + "/w4a16", precision);
    auto assistant = Gemma4Assistant::load(kFixtures + "assistant_e2b_tied/w4a16", *target);
    std::vector<EngineRequest> requests;
    for (size_t cut : {size_t{5}, size_t{17}, r.tokens.size()}) {
      EngineRequest q;
      q.prompt.assign(r.tokens.begin(), r.tokens.begin() + cut);
      q.max_tokens = 24;
      q.sampling.temperature = 0;
      q.ignore_eos = true;
      requests.push_back(std::move(q));
    }
    EngineOptions options{.max_running = 3, .kv_block_size = 4, .max_draft_tokens = 4};
    EngineStats plain_stats, spec_stats;
    const auto plain = run_batch(*target, options, requests, &plain_stats);
    options.assistant = assistant.get();
    for (auto& q : requests) q.speculative = SpeculativeConfig{SpeculativeMethod::Assistant, 4};
    const auto spec = run_batch(*target, options, requests, &spec_stats);
    EXPECT_EQ(spec, plain);
    EXPECT_EQ(plain_stats.spec_draft_tokens, 0u);
    EXPECT_GT(spec_stats.spec_draft_tokens, 0u);
    EXPECT_GT(spec_stats.spec_drafts, 0u);
  }
}

// The command line: `generate --assistant` prints the ids plain greedy `generate` prints (both stop on eos).
TEST(AssistantParity, GenerateWithAssistantPrintsPlainGreedyIds) {
  const Reference r = load_reference("assistant_e2b_tied");
  std::string ids;
  for (int32_t t : r.tokens) ids += std::to_string(t) + ",";
  ids.pop_back();
  const std::string common = "generate --model '" + kFixtures + "e2b_like/w4a16' --tokens " + ids +
                             " --temperature 0 --max-tokens 40 --print-ids --precision f32";
  const test::CliResult plain = test::qatserve(common);
  const test::CliResult assisted =
      test::qatserve(common + " --assistant '" + kFixtures + "assistant_e2b_tied/w4a16' --num-speculative-tokens 3");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(assisted.exit_code, 0) << assisted.output;
  auto ids_line = [](const std::string& out) {  // the printed ids, among the progress lines
    std::smatch m;
    return std::regex_search(out, m, std::regex("(^|\n)([0-9]+(,[0-9]+)+)\n")) ? m[2].str() : "(none)";
  };
  EXPECT_NE(ids_line(plain.output), "(none)") << plain.output;
  EXPECT_EQ(ids_line(assisted.output), ids_line(plain.output)) << assisted.output;
  EXPECT_NE(assisted.output.find("draft tokens accepted"), std::string::npos) << assisted.output;
  const test::CliResult missing = test::qatserve(common + " --speculative assistant");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--assistant DIR"), std::string::npos) << missing.output;
}

// A copy of a fixture drafter with config.json fields changed.
std::filesystem::path edited_assistant(const test::TempDir& tmp, const std::string& fixture,
                                       const std::function<void(nlohmann::json&)>& edit) {
  const auto dir = tmp / "assistant";
  std::filesystem::copy(kFixtures + fixture + "/bf16", dir);
  nlohmann::json config = nlohmann::json::parse(read_file(dir / "config.json"));
  edit(config);
  std::ofstream(dir / "config.json", std::ios::trunc) << config.dump(2);
  return dir;
}

std::string load_error(const std::filesystem::path& assistant_dir, const std::string& target) {
  auto model = Gemma4Model::load(kFixtures + target + "/bf16", Precision::F32);
  try {
    Gemma4Assistant::load(assistant_dir, *model);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(AssistantLoad, ChecksItAgainstTheTarget) {
  EXPECT_NE(load_error(kFixtures + "assistant_moe_ordered/bf16", "e2b_like").find("vocab_size 384 does not match the "
                                                                                  "target's vocab_size 512"),
            std::string::npos);
  EXPECT_NE(load_error(kFixtures + "e2b_like/bf16", "e2b_like").find("model_type \"gemma4\" is not an assistant"),
            std::string::npos);
  {
    test::TempDir tmp;
    const auto dir = edited_assistant(tmp, "assistant_e2b_tied", [](nlohmann::json& c) { c["backbone_hidden_size"] = 32; });
    EXPECT_NE(load_error(dir, "e2b_like").find("backbone_hidden_size 32 does not match the target's hidden_size 64"),
              std::string::npos);
  }
  {
    test::TempDir tmp;
    const auto dir = edited_assistant(tmp, "assistant_e2b_tied",
                                      [](nlohmann::json& c) { c["text_config"]["num_key_value_heads"] = 2; });
    EXPECT_NE(load_error(dir, "e2b_like").find("assistant layer 0 (sliding_attention) expects K/V of 2 heads x 16 "
                                              "dims, but target layer 3 stores 1 x 16"),
              std::string::npos)
        << load_error(dir, "e2b_like");
  }
  {
    test::TempDir tmp;
    const auto dir = edited_assistant(tmp, "assistant_e2b_ordered", [](nlohmann::json& c) { c["num_centroids"] = 7; });
    EXPECT_NE(load_error(dir, "e2b_like").find("'num_centroids' (7) must divide text_config.vocab_size (512)"),
              std::string::npos)
        << load_error(dir, "e2b_like");
  }
  {
    test::TempDir tmp;
    const auto dir = edited_assistant(tmp, "assistant_e2b_tied",
                                      [](nlohmann::json& c) { c["text_config"]["num_kv_shared_layers"] = 1; });
    EXPECT_NE(load_error(dir, "e2b_like").find("every layer of an assistant reads the target's K/V"),
              std::string::npos)
        << load_error(dir, "e2b_like");
  }
  // An assistant is no target: loading one as --model fails on its first forward, saying what it is.
  auto drafter = Gemma4Model::load(kFixtures + "assistant_e2b_tied/bf16", Precision::F32);
  KvCache cache = Gemma4Model::load(kFixtures + "e2b_like/bf16", Precision::F32)->new_cache(4);
  const std::vector<int32_t> ids{2, 5};
  EXPECT_THROW(drafter->forward(ids, cache, true), Error);
}

}  // namespace
}  // namespace qs
