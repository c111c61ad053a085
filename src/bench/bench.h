#pragma once
// `qatserve bench`: prefill and decode speed of one checkpoint, driven straight through Gemma4Model (no engine,
// no server), each speed set beside the bytes a token makes the machine read and this machine's measured memory
// bandwidth, so a row says how far it is from the bandwidth bound, not just how fast it is. With a speculative
// method it measures speculative decoding instead: decoding runs through the engine's own speculative path (the
// Generator), beside plain decoding, with each part of a round (drafting, verifying) timed on the model itself.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/lora_bench.h"
#include "engine/speculative_config.h"
#include "formats/model_config.h"
#include "model/kv_cache.h"
#include "util/bandwidth.h"

namespace qs {

class Checkpoint;

struct BenchOptions {
  std::filesystem::path model;
  std::string precision = "bf16";
  std::vector<int64_t> prompts{128, 512, 2048};  // prefill lengths
  std::vector<int64_t> streams{1, 4, 8};         // sequences decoded together, one token each per step
  std::vector<int64_t> depths{0, 4096};          // positions already in every stream's cache before decoding
  int64_t decode_tokens = 32;                    // timed decode steps per row
  int64_t prefill_chunk = 512;                   // prompt tokens per forward call (llama-bench's default ubatch)
  int repeat = 1;                                // runs per row; the median is reported
  unsigned threads = 0;                          // 0 = one per core
  std::string isa;                               // every kernel family's (avx512 | avx2 | portable); empty = the widest
  uint64_t sweep_bytes = 2ull << 30;             // bandwidth sweep buffer, far past the 260 MB L3
  // When > 0, a read sweep of this many bytes after every timed decode step (its time not counted), so that a row's
  // fraction sets each step beside the bandwidth of its own moment on a host whose bandwidth moves within a second.
  uint64_t paired_sweep_bytes = 0;
  // KV cache dtypes ("bf16", "int8", ...): every row once per dtype, runs alternating; empty: the precision's.
  // Each dtype other than the precision's default also gets its logit error against that default.
  std::vector<std::string> kv_dtypes;
  int64_t kv_error_positions = 256;  // prompt length of that comparison
  bool random_fill = false;          // depth rows: caches filled with random K/V rows instead of a prefill
  // Speculative decoding (a method other than None): instead of the prefill and decode rows, one stream decodes
  // the same prompt greedily with the drafter and without it, in turn (speculative_rows below).
  SpeculativeConfig speculative;               // the method and prompt lookup's n (its k: speculative_tokens)
  std::vector<int64_t> speculative_tokens{4};  // draft tokens per round of each speculative row
  std::filesystem::path assistant, draft_model;  // the drafter of methods assistant and draft_model
  int64_t speculative_prompt = 128;  // its prompt: a 32-token segment repeated (prompt lookup finds continuations)
  // Scripted agreement (a measuring instrument for drafters that agree with nothing, such as random weights): the
  // drafter still runs, then each of its tokens becomes plain greedy decoding's token at that position with this
  // probability, independently, else another one; the target's verification judges them as always.
  std::optional<double> draft_acceptance;
  // LoRA adapters (bench --lora): instead of the plain rows, each prefill and decode row on the base and with the
  // adapters in turn (lora_bench.h).
  std::vector<std::filesystem::path> loras;
};

// "128,512,2048" -> {128, 512, 2048}. Every item a positive integer, or zero too when allow_zero (depths).
std::vector<int64_t> parse_count_list(const std::string& text, const std::string& flag, bool allow_zero = false);

// What one forward call reads from memory, from the checkpoint's tensors as stored (int4 or bf16, per tensor) and
// the architecture. Which experts a token picks is not exposed by the model, so MoE reads assume uniform routing:
// n tokens touch an expected E * (1 - (1 - k/E)^n) of a layer's E experts (k/E of them for one token).
struct ReadBytes {
  uint64_t model_linears = 0;  // per_layer_model_projection and model-level norms: read by every call
  uint64_t lm_head = 0;        // the tied embedding: read by every call that returns logits
  uint64_t gather = 0;         // per token: its embedding row and its per-layer-embedding row
  std::vector<uint64_t> layer_dense, layer_experts;  // per layer: everything but experts; all experts
  std::vector<uint64_t> layer_kv_row;                // per layer: K+V bytes of one cached position it attends
  std::vector<int64_t> layer_window;                 // per layer: sliding window, 0 = full attention
  int64_t first_shared = 0;                          // layers from here on skip rows whose logits are unwanted
  int64_t num_experts = 0, top_k = 0;

  // Weights read by one call over `rows` tokens of which `wanted` return logits; with_experts: plus the experts'
  // expected share under uniform routing (without: the bench adds the bytes of the experts actually chosen).
  uint64_t call_weights(int64_t rows, int64_t wanted, bool with_experts = true) const;
  // K/V one token at `position` reads, over every layer (all_layers) or the layers before first_shared only.
  uint64_t kv_read(int64_t position, bool all_layers) const;

  // Per token, when `streams` sequences decode one token each at `depth`..depth+steps-1.
  uint64_t decode_weights_per_token(int64_t streams, bool with_experts = true) const;
  uint64_t decode_kv_per_token(int64_t depth, int64_t steps) const;
  // Per prompt token, when a `prompt`-token prompt is prefilled in chunks of `chunk` (logits for its last token).
  uint64_t prefill_weights_per_token(int64_t prompt, int64_t chunk, bool with_experts = true) const;
  uint64_t prefill_kv_per_token(int64_t prompt, int64_t chunk) const;
};

// kv_dtype: how the cache stores K and V (its bytes a row, kv_cache.h). lm_head_bytes: the LM head as the model
// reads it (its int4 repack of the tied embedding, when it made one); by default the embedding as stored.
ReadBytes read_bytes(const Checkpoint& checkpoint, const ModelConfig& config, KvDtype kv_dtype,
                     std::optional<uint64_t> lm_head_bytes = std::nullopt);

struct BenchRow {
  std::string phase;     // "prefill" or "decode"
  int64_t tokens = 0;    // prefill: prompt length
  int64_t streams = 0;   // decode: sequences per step
  int64_t depth = 0;     // decode: cached positions before the first timed step
  std::string kv_dtype;  // of the row's caches
  double tokens_per_second = 0;              // median over the repeats
  std::vector<double> runs;                  // every repeat's tokens/s
  uint64_t weight_bytes_per_token = 0, kv_bytes_per_token = 0;
  double bytes_per_second = 0;               // (weights + KV per token) x tokens/s
  double bandwidth_fraction = 0;             // of the measured read bandwidth
  // With a paired sweep (decode rows): every timed step's seconds and the sweep's bytes/s right after it; the
  // sweep rate over the steps' time (sum of seconds x rate over the seconds), and the bytes the steps read over
  // sum of seconds x rate.
  std::vector<double> step_seconds, step_sweeps;
  double paired_bandwidth = 0, paired_fraction = 0;
};

// Two runs on the same weights, every position of one prompt: int8 activations against bf16, or a KV cache dtype
// against the precision's default one.
struct LogitError {
  int64_t positions = 0;
  double max_abs = 0, mean_abs = 0;  // |approx - exact| over every logit
  double exact_spread = 0;           // mean over positions of (max - min) exact logit, for scale
  int64_t top1_agree = 0;            // positions whose greedy token is the same
  double mean_kl = 0;                // mean KL(exact || approx) of the softmaxed logits, in nats
};

struct KvError {
  std::string dtype, reference;  // a KV cache dtype against the precision's default one
  LogitError error;
};

// Speculative decoding beside plain decoding, one stream, greedy, through the engine (engine/speculative.h).
struct SpeculativeRow {
  int64_t k = 0;                        // draft tokens per round, at most
  std::vector<double> runs;             // decode tokens/s of each repeat
  double tokens_per_second = 0;         // median
  double ratio = 0;                     // against plain decoding's median
  uint64_t rounds = 0, draft_tokens = 0, accepted_tokens = 0;  // verify rounds with a draft, over every repeat
  double acceptance() const { return draft_tokens ? double(accepted_tokens) / double(draft_tokens) : 0; }
  double tokens_per_round() const { return rounds ? 1 + double(accepted_tokens) / double(rounds) : 1; }
  bool same_ids = true;  // the greedy ids equal plain decoding's, in every repeat
};

// What one round costs, measured on the target and the drafter at the prompt's end (medians).
struct RoundCost {
  int64_t k = 0;
  double draft_seconds = 0;   // the drafter proposing k tokens
  double verify_seconds = 0;  // one target call over k + 1 positions (the last token and k drafts)
  uint64_t verify_weight_bytes = 0;  // what that call reads of the weights: once for all k + 1 positions
};

struct SpeculativeReport {
  std::string method, drafter;
  int64_t prompt_tokens = 0, decode_tokens = 0;
  std::vector<double> plain_runs;  // plain decoding's tokens/s, each repeat
  double plain_tokens_per_second = 0;
  std::vector<SpeculativeRow> rows;
  std::optional<double> scripted_acceptance;  // BenchOptions::draft_acceptance
  double step_seconds = 0;           // one plain single-token step
  uint64_t step_weight_bytes = 0;
  std::vector<RoundCost> costs;      // k = 1 .. the largest k of the rows
};

// Leviathan et al. (2023), drafts accepted i.i.d. with probability alpha: (1 - alpha^(k+1)) / (1 - alpha) tokens a
// round, which takes draft + verify(k + 1); plain decoding takes step_seconds a token.
inline constexpr double kProjectionAlphas[] = {0.5, 0.6, 0.7, 0.8, 0.9};  // the projection table's rows
double expected_tokens_per_round(double alpha, int64_t k);
double projected_speedup(double alpha, const RoundCost& cost, double step_seconds);

struct BenchReport {
  std::string model, precision;
  bool int4_weights = false;
  std::string lm_head;  // "int4" (lossless repack of the tied embedding) or "bf16"
  std::string isa;      // the kernels' instruction set
  bool bf16_dot_products = false;  // the linears multiply bf16 activations by vdpbf16ps (kernels/linear.h)
  std::string int4_layout;  // where int4 weights lie in memory (linear.h's Int4Layout: rows, tiles, columns, blocks)
  unsigned threads = 0;
  int64_t decode_tokens = 0, prefill_chunk = 0;
  int repeat = 0;
  double kv_element_bytes = 0;                 // of the first KV dtype
  std::vector<std::string> kv_dtypes;          // of the rows, in order
  std::vector<double> kv_element_bytes_each;   // per KV dtype
  BandwidthResult bandwidth;
  uint64_t paired_sweep_bytes = 0;  // BenchOptions's: 0 = no paired sweeps
  std::vector<BenchRow> rows;
  std::vector<std::string> notes;  // how the numbers were made (assumptions the reader needs)
  std::optional<LogitError> int8_error;  // with --precision int8
  std::vector<KvError> kv_errors;        // each KV dtype but the precision's default
  std::optional<SpeculativeReport> speculative;
  std::optional<LoraBenchReport> lora;
};

// Runs the bandwidth sweep, then every prefill and decode row. `log` gets one line per step as it goes.
BenchReport run_bench(const BenchOptions& options, const std::function<void(const std::string&)>& log = {});

std::string format_bench_report(const BenchReport& report);  // markdown table and notes
nlohmann::ordered_json bench_report_json(const BenchReport& report);
void write_bench_json(const BenchReport& report, const std::filesystem::path& path);  // throws naming the path

}  // namespace qs
