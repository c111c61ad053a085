// `qatserve bench`: its list flags, the bytes-per-token arithmetic against hand counts and the memory plan, and a
// tiny end-to-end run (its shape only: timings are never asserted).
#include "bench/bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "checkpoint_tools/synth.h"
#include "engine/memory_plan.h"
#include "formats/checkpoint.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

TEST(BenchArgs, ParsesCountLists) {
  EXPECT_EQ(parse_count_list("128,512,2048", "--prompts"), (std::vector<int64_t>{128, 512, 2048}));
  EXPECT_EQ(parse_count_list("7", "--streams"), (std::vector<int64_t>{7}));
  EXPECT_EQ(parse_count_list("0,4096", "--depths", true), (std::vector<int64_t>{0, 4096}));
  for (const char* bad : {"", "0", "-1", "12,,3", "x", "4,5x", "3,"})
    EXPECT_THROW(parse_count_list(bad, "--prompts"), Error) << bad;
  try {
    parse_count_list("8,abc", "--streams");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--streams: 'abc'"), std::string::npos) << e.what();
  }
}

class BenchBytes : public ::testing::Test {
 protected:
  std::filesystem::path synth(const std::string& preset, CheckpointFormat format) {
    return test::synth_quietly(
        {.preset = preset, .format = format, .out = tmp_ / (preset + (format == CheckpointFormat::W4A16 ? "-w4" : "-bf16"))});
  }
  static ModelConfig config_of(const Checkpoint& ckpt) { return read_model_config(*ckpt.config_path()); }
  test::TempDir tmp_;
};

// Every byte the model loads is counted exactly once: the layers, the model-level linears, the tied LM head, and
// the per-layer-embedding table (gathered, so outside the per-call bytes), summing to the memory plan's total.
TEST_F(BenchBytes, WeightsAddUpToThePlan) {
  for (auto [preset, format] : {std::pair{"e2b-tiny", CheckpointFormat::Bf16}, {"e2b-tiny", CheckpointFormat::W4A16},
                                {"26b-a4b-tiny", CheckpointFormat::Bf16}, {"26b-a4b-tiny", CheckpointFormat::W4A16},
                                {"12b-tiny", CheckpointFormat::Bf16}, {"12b-tiny", CheckpointFormat::W4A16}}) {
    Checkpoint ckpt = Checkpoint::open(synth(preset, format));
    ModelConfig cfg = config_of(ckpt);
    const Gemma4TextConfig& c = cfg.text;
    ReadBytes rb = read_bytes(ckpt, cfg, KvDtype::F32);
    const uint64_t ple_table = c.has_ple() ? uint64_t(c.vocab_size_per_layer_input) * c.num_hidden_layers *
                                                 c.hidden_size_per_layer_input * 2 : 0;
    const uint64_t dense = std::accumulate(rb.layer_dense.begin(), rb.layer_dense.end(), uint64_t{0});
    const uint64_t experts = std::accumulate(rb.layer_experts.begin(), rb.layer_experts.end(), uint64_t{0});
    EXPECT_EQ(dense + experts + rb.model_linears + rb.lm_head + ple_table,
              weight_bytes_from_checkpoint(ckpt, cfg).total()) << preset;
    EXPECT_EQ(rb.lm_head, uint64_t(c.vocab_size) * c.hidden_size * 2);
    EXPECT_EQ(experts > 0, c.enable_moe_block) << preset;
  }
}

TEST_F(BenchBytes, DecodeAndPrefillArithmetic) {
  Checkpoint ckpt = Checkpoint::open(synth("26b-a4b-tiny", CheckpointFormat::W4A16));
  ModelConfig cfg = config_of(ckpt);
  ReadBytes rb = read_bytes(ckpt, cfg, KvDtype::BF16);
  ASSERT_GT(rb.num_experts, rb.top_k);
  const double dense = std::accumulate(rb.layer_dense.begin(), rb.layer_dense.end(), 0.0) + rb.model_linears + rb.lm_head;
  const double experts = std::accumulate(rb.layer_experts.begin(), rb.layer_experts.end(), 0.0);
  // One token: k of E experts; n tokens: the expected distinct share 1 - (1 - k/E)^n, never more than all.
  const double k_over_e = double(rb.top_k) / double(rb.num_experts);
  EXPECT_NEAR(double(rb.decode_weights_per_token(1)), dense + experts * k_over_e + rb.gather, 2);
  const double four = 1 - std::pow(1 - k_over_e, 4);
  EXPECT_NEAR(double(rb.decode_weights_per_token(4)), (dense + experts * four) / 4 + rb.gather, 2);
  EXPECT_LE(rb.call_weights(1000, 1000), uint64_t(dense + experts) + 1);
  // Without KV sharing every layer sees every row: a 10-token prompt in chunks of 4 reads the layers 3 times and
  // the LM head once.
  ASSERT_EQ(rb.first_shared, cfg.text.num_hidden_layers);
  EXPECT_EQ(rb.prefill_weights_per_token(10, 4),
            (rb.call_weights(4, 0) * 2 + rb.call_weights(2, 1)) / 10 + rb.gather);
  EXPECT_EQ(rb.call_weights(4, 0) + rb.lm_head, rb.call_weights(4, 1));
}

// e2b-tiny: layers s s f s | s f s f (first KV-shared layer 4), window 4, one KV head, head_dim 16 / 32 global;
// with 4-byte values a sliding position is 2 x 16 x 4 = 128 bytes, a full one 256.
TEST_F(BenchBytes, KvReadsCountWindowsAndSharedLayers) {
  Checkpoint ckpt = Checkpoint::open(synth("e2b-tiny", CheckpointFormat::Bf16));
  ModelConfig cfg = config_of(ckpt);
  ReadBytes rb = read_bytes(ckpt, cfg, KvDtype::F32);
  ASSERT_EQ(rb.first_shared, 4);
  EXPECT_EQ(rb.kv_read(0, true), 5 * 128u + 3 * 256u);
  EXPECT_EQ(rb.kv_read(10, true), 5 * 128u * 4 + 3 * 256u * 11);   // sliding layers stop at the window
  EXPECT_EQ(rb.kv_read(10, false), 3 * 128u * 4 + 1 * 256u * 11);  // layers 0-3 only
  EXPECT_EQ(rb.decode_kv_per_token(10, 2), (rb.kv_read(10, true) + rb.kv_read(11, true)) / 2);
  // A prefill's rows without logits stop before the shared layers; its last row reads them all.
  uint64_t sum = rb.kv_read(5, true) - rb.kv_read(5, false);
  for (int p = 0; p < 6; ++p) sum += rb.kv_read(p, false);
  EXPECT_EQ(rb.prefill_kv_per_token(6, 4), sum / 6);
  // Weights: chunks without logits skip the shared layers' weights and the LM head.
  const uint64_t early = std::accumulate(rb.layer_dense.begin(), rb.layer_dense.begin() + 4, uint64_t{0});
  EXPECT_EQ(rb.call_weights(4, 0), rb.model_linears + early);
  EXPECT_EQ(rb.gather, 64u * 2 + 8u * 32 * 2);
}

TEST_F(BenchBytes, RunsEveryRowOnATinyModel) {
  BenchOptions o;
  o.model = synth("e2b-tiny", CheckpointFormat::W4A16);
  o.prompts = {6};
  o.streams = {1, 3};
  o.depths = {0, 5};
  o.decode_tokens = 2;
  o.prefill_chunk = 4;
  o.sweep_bytes = 32ull << 20;
  std::vector<std::string> log;
  BenchReport r = run_bench(o, [&](const std::string& s) { log.push_back(s); });
  ASSERT_EQ(r.rows.size(), 5u);
  EXPECT_EQ(r.rows[0].phase, "prefill");
  EXPECT_EQ(r.rows[0].tokens, 6);
  EXPECT_EQ(r.rows[4].phase, "decode");
  EXPECT_EQ(r.rows[4].streams, 3);
  EXPECT_EQ(r.rows[4].depth, 5);
  EXPECT_EQ(r.kv_element_bytes, 2);  // bf16 activations keep a bf16 cache
  Checkpoint ckpt = Checkpoint::open(o.model);
  const Gemma4TextConfig c = config_of(ckpt).text;
  // Synthetic embeddings lie on the QAT grid, as QAT exports' do: the model reads an int4 LM head.
  EXPECT_EQ(r.lm_head, "int4");
  const uint64_t int4_head = uint64_t(c.vocab_size) * c.hidden_size / 2 + uint64_t(c.vocab_size) * c.hidden_size / 16;
  ReadBytes rb = read_bytes(ckpt, config_of(ckpt), KvDtype::BF16, int4_head);
  EXPECT_EQ(r.rows[4].weight_bytes_per_token, rb.decode_weights_per_token(3));
  EXPECT_EQ(r.rows[4].kv_bytes_per_token, rb.decode_kv_per_token(5, 2));
  for (const BenchRow& row : r.rows) EXPECT_EQ(row.runs.size(), 1u);
  EXPECT_GE(r.bandwidth.buffer_bytes, 32ull << 20);
  EXPECT_FALSE(r.bandwidth.isa.empty());
  EXPECT_FALSE(log.empty());

  std::string table = format_bench_report(r);
  EXPECT_NE(table.find("| decode | 3 streams | 5 |"), std::string::npos) << table;
  auto j = bench_report_json(r);
  EXPECT_EQ(j["rows"].size(), 5u);
  EXPECT_EQ(j["rows"][4]["streams"], 3);
  EXPECT_TRUE(j["bandwidth"].contains("bytes_per_second"));
}

// --paired-sweep: each timed decode step gets a sweep of its own, and the row's fraction is what the steps read
// over what the machine read at those sweeps' rates in the steps' seconds; prefill rows get none.
TEST_F(BenchBytes, PairedSweepFollowsEveryDecodeStep) {
  BenchOptions o;
  o.model = synth("e2b-tiny", CheckpointFormat::W4A16);
  o.prompts = {4};
  o.streams = {2};
  o.depths = {0};
  o.decode_tokens = 3;
  o.repeat = 2;
  o.sweep_bytes = o.paired_sweep_bytes = 32ull << 20;
  BenchReport r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.paired_sweep_bytes, 32ull << 20);
  EXPECT_TRUE(r.rows[0].step_sweeps.empty());
  const BenchRow& decode = r.rows[1];
  ASSERT_EQ(decode.step_sweeps.size(), 6u);
  ASSERT_EQ(decode.step_seconds.size(), 6u);
  double seconds = 0, could_read = 0;
  for (size_t i = 0; i < 6; ++i)
    seconds += decode.step_seconds[i], could_read += decode.step_seconds[i] * decode.step_sweeps[i];
  const double read = double(decode.weight_bytes_per_token + decode.kv_bytes_per_token) * 2 * 6;  // 2 streams
  EXPECT_DOUBLE_EQ(decode.paired_fraction, read / could_read);
  EXPECT_DOUBLE_EQ(decode.paired_bandwidth, could_read / seconds);
  // tokens/s counts the steps only, not the sweeps between them
  double run_seconds[2] = {};
  for (size_t i = 0; i < 6; ++i) run_seconds[i / 3] += decode.step_seconds[i];
  EXPECT_DOUBLE_EQ(decode.runs[0], 6 / run_seconds[0]);
  EXPECT_DOUBLE_EQ(decode.runs[1], 6 / run_seconds[1]);

  const std::string table = format_bench_report(r);
  EXPECT_NE(table.find("of paired sweep |"), std::string::npos) << table;
  EXPECT_NE(table.find("| prefill | 4 tokens | 0 | bf16 |"), std::string::npos) << table;
  EXPECT_NE(table.find("% of "), std::string::npos) << table;
  const auto j = bench_report_json(r);
  EXPECT_EQ(j["paired_sweep_bytes"], 32ull << 20);
  EXPECT_FALSE(j["rows"][0].contains("paired_bandwidth_fraction"));
  EXPECT_DOUBLE_EQ(j["rows"][1]["paired_bandwidth_fraction"].get<double>(), decode.paired_fraction);
}

// MoE: rows count the experts the tokens actually chose. One token chooses exactly top_k distinct experts in every
// layer, which the uniform estimate also gives for one token; more tokens share experts, so their reads per token
// stay at or under the estimate of that many tokens and above one token's share.
TEST_F(BenchBytes, MoeRowsCountTheChosenExperts) {
  BenchOptions o;
  o.model = synth("26b-a4b-tiny", CheckpointFormat::W4A16);
  o.prompts = {5};
  o.streams = {1, 4};
  o.depths = {0};
  o.decode_tokens = 3;
  o.sweep_bytes = 32ull << 20;
  BenchReport r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 3u);
  Checkpoint ckpt = Checkpoint::open(o.model);
  const Gemma4TextConfig c = config_of(ckpt).text;
  const uint64_t int4_head = uint64_t(c.vocab_size) * c.hidden_size / 2 + uint64_t(c.vocab_size) * c.hidden_size / 16;
  ReadBytes rb = read_bytes(ckpt, config_of(ckpt), KvDtype::BF16, int4_head);
  // The estimate counts each expert module's 16-byte weight_shape tensor too, which the model never reads.
  const double shapes = double(c.num_hidden_layers * c.top_k_experts * 3 * 16);
  EXPECT_NEAR(double(r.rows[1].weight_bytes_per_token), double(rb.decode_weights_per_token(1)) - shapes, 2);
  EXPECT_LE(r.rows[2].weight_bytes_per_token, rb.decode_weights_per_token(4) + 2);
  EXPECT_GT(r.rows[2].weight_bytes_per_token, rb.decode_weights_per_token(4, false));
  EXPECT_NE(r.notes.back().find("actually chose"), std::string::npos);
}

// ---- bench --speculative ----

const std::filesystem::path kSource = QATSERVE_SOURCE_DIR;

BenchOptions speculative_options(const std::filesystem::path& model, SpeculativeMethod method,
                                 std::vector<int64_t> ks) {
  BenchOptions o;
  o.model = model;
  o.speculative.method = method;
  o.speculative_tokens = std::move(ks);
  o.speculative_prompt = 40;
  o.decode_tokens = 12;
  o.sweep_bytes = 32ull << 20;
  return o;
}

// The shape of a speculative report, whatever the drafter: a row per k whose greedy ids equal plain decoding's,
// acceptance counted, the round costs of every k up to the largest measured.
void expect_speculative_report(const BenchReport& r, const std::vector<int64_t>& ks) {
  ASSERT_TRUE(r.speculative);
  const SpeculativeReport& s = *r.speculative;
  EXPECT_TRUE(r.rows.empty());  // the prefill and decode rows are not run beside it
  ASSERT_EQ(s.rows.size(), ks.size());
  EXPECT_EQ(s.plain_runs.size(), 1u);
  EXPECT_GT(s.plain_tokens_per_second, 0);
  for (size_t i = 0; i < ks.size(); ++i) {
    const SpeculativeRow& row = s.rows[i];
    EXPECT_EQ(row.k, ks[i]);
    EXPECT_TRUE(row.same_ids) << "k=" << row.k;
    EXPECT_GT(row.draft_tokens, 0u) << "k=" << row.k;
    EXPECT_LE(row.accepted_tokens, row.draft_tokens);
    EXPECT_LE(row.draft_tokens, row.rounds * uint64_t(row.k));
    EXPECT_GE(row.acceptance(), 0);
    EXPECT_LE(row.acceptance(), 1);
    EXPECT_GT(row.tokens_per_second, 0);
  }
  const int64_t max_k = *std::max_element(ks.begin(), ks.end());
  ASSERT_EQ(int64_t(s.costs.size()), max_k);
  for (int64_t k = 1; k <= max_k; ++k) {
    const RoundCost& c = s.costs[k - 1];
    EXPECT_EQ(c.k, k);
    EXPECT_GT(c.verify_seconds, 0);
    EXPECT_GT(c.verify_weight_bytes, s.step_weight_bytes);  // the same weights, plus k more rows' gathers
  }
  const std::string table = format_bench_report(r);
  EXPECT_NE(table.find("| k | tokens/s | ratio | acceptance"), std::string::npos) << table;
  EXPECT_NE(table.find("projected speedup (NOT measured"), std::string::npos) << table;
  EXPECT_EQ(table.find("| NO |"), std::string::npos) << table;
  const auto j = bench_report_json(r);
  EXPECT_EQ(j["speculative"]["rows"].size(), ks.size());
  EXPECT_EQ(j["speculative"]["round_costs"].size(), size_t(max_k));
}

// A synthetic assistant beside its synthetic target (random weights: they rarely agree, but every draft is verified
// and the output is plain greedy's).
TEST_F(BenchBytes, SpeculativeAssistantRowsOnSynthPresets) {
  BenchOptions o = speculative_options(synth("e2b-tiny", CheckpointFormat::W4A16), SpeculativeMethod::Assistant, {1, 3});
  o.assistant = synth("e2b-tiny-assistant", CheckpointFormat::W4A16);
  expect_speculative_report(run_bench(o), {1, 3});
}

// The transformers-made assistant fixture beside its target (tests/fixtures, make_assistant_fixtures.py).
TEST(BenchSpeculative, AssistantFixtureBesideItsTarget) {
  BenchOptions o = speculative_options(kSource / "tests/fixtures/e2b_like/bf16", SpeculativeMethod::Assistant, {2});
  o.assistant = kSource / "tests/fixtures/assistant_e2b_tied/bf16";
  expect_speculative_report(run_bench(o), {2});
}

// --draft-acceptance: drafts scripted always right are all accepted, never right none; the output stays plain
// greedy's either way (the target's verification judges the scripted tokens).
TEST(BenchSpeculative, ScriptedDraftsAreAcceptedExactlyWhenRight) {
  for (double acceptance : {0.0, 1.0}) {
    BenchOptions o = speculative_options(kSource / "tests/fixtures/e2b_like/bf16", SpeculativeMethod::Assistant, {3});
    o.assistant = kSource / "tests/fixtures/assistant_e2b_tied/bf16";
    o.draft_acceptance = acceptance;
    const BenchReport r = run_bench(o);
    expect_speculative_report(r, {3});
    const SpeculativeRow& row = r.speculative->rows[0];
    EXPECT_EQ(row.accepted_tokens, acceptance == 1 ? row.draft_tokens : 0u) << "acceptance " << acceptance;
    EXPECT_EQ(bench_report_json(r)["speculative"]["scripted_acceptance"], acceptance);
    EXPECT_NE(format_bench_report(r).find("drafts scripted to agree with probability"), std::string::npos);
  }
  BenchOptions o = speculative_options(kSource / "tests/fixtures/e2b_like/bf16", SpeculativeMethod::Ngram, {2});
  o.draft_acceptance = 1.5;
  EXPECT_THROW(run_bench(o), Error);
}

// Prompt lookup on the trained demo model: the copy prompt (a segment repeated) is continued, so drafts are accepted.
TEST(BenchSpeculative, NgramAcceptsOnTheTrainedDemoModel) {
  BenchOptions o = speculative_options(kSource / "models/gemma4-tiny-qat", SpeculativeMethod::Ngram, {4});
  const BenchReport r = run_bench(o);
  expect_speculative_report(r, {4});
  EXPECT_GT(r.speculative->rows[0].accepted_tokens, 0u);
  EXPECT_GT(r.speculative->rows[0].tokens_per_round(), 1);
}

// The target as its own draft model: greedy drafts are exactly what the target picks, so every one is accepted
// and each round yields k + 1 tokens (but where the request's end cuts the draft short).
TEST(BenchSpeculative, DraftModelEqualToTheTargetIsAlwaysAccepted) {
  const std::filesystem::path target = kSource / "tests/fixtures/e2b_like/w4a16";
  BenchOptions o = speculative_options(target, SpeculativeMethod::DraftModel, {3});
  o.draft_model = target;
  const BenchReport r = run_bench(o);
  expect_speculative_report(r, {3});
  EXPECT_EQ(r.speculative->rows[0].accepted_tokens, r.speculative->rows[0].draft_tokens);
}

TEST(BenchSpeculative, NamesTheMissingDrafter) {
  BenchOptions o = speculative_options(kSource / "tests/fixtures/e2b_like/bf16", SpeculativeMethod::Assistant, {2});
  try {
    run_bench(o);
    FAIL() << "no assistant given";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--assistant"), std::string::npos) << e.what();
  }
  o = speculative_options(kSource / "tests/fixtures/e2b_like/bf16", SpeculativeMethod::Ngram, {0});
  EXPECT_THROW(run_bench(o), Error);
}

// Leviathan et al.'s expected tokens per round, and the projection from round costs, by hand.
TEST(BenchSpeculative, ProjectionArithmetic) {
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(0.5, 1), 1.5);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(0.5, 3), 1.875);
  EXPECT_NEAR(expected_tokens_per_round(0.7, 4), 1 + 0.7 + 0.49 + 0.343 + 0.2401, 1e-12);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(1.0, 4), 5);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(0.0, 4), 1);
  // k = 2 at a = 0.8: 2.44 tokens a round of 2 ms drafting + 12 ms verifying, against 10 ms a plain token.
  const RoundCost c{.k = 2, .draft_seconds = 0.002, .verify_seconds = 0.012};
  EXPECT_NEAR(projected_speedup(0.8, c, 0.010), 2.44 * 0.010 / 0.014, 1e-12);
}

}  // namespace
}  // namespace qs
