#include "bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "bench/bench_util.h"
#include "bench/speculative_bench.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "model/gemma4.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {

std::vector<int64_t> parse_count_list(const std::string& text, const std::string& flag, bool allow_zero) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (true) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || (v == 0 && !allow_zero))
      throw Error(fmt::format("{}: '{}' is not a {} integer (expected a comma-separated list, e.g. 128,512)", flag,
                              item, allow_zero ? "non-negative" : "positive"));
    out.push_back(v);
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

// ---- running ----

namespace {

using namespace bench_util;

// Runs `tokens` into `cache` in chunks, logits only for the last token, as a server's chunked prefill does.
void prefill(const Gemma4Model& model, std::span<const int32_t> tokens, KvCache& cache, int64_t chunk) {
  for (size_t s = 0; s < tokens.size(); s += chunk) {
    const size_t m = std::min<size_t>(chunk, tokens.size() - s);
    SequenceStep step{tokens.subspan(s, m), &cache, s + m == tokens.size() ? LogitsWanted::Last : LogitsWanted::None};
    model.forward_batch(std::span(&step, 1));
  }
}

// Bytes of one cached K or V value of `dtype` (int8: with its share of the scales), from the model's cache layout,
// so a change of layout shows up here.
double kv_element_bytes(const Gemma4Model& model, KvDtype dtype) {
  KvLayout l = model.kv_layout();
  l.dtype = dtype;
  const KvClass c = l.layers[0] ? KvClass::Full : KvClass::Sliding;
  return double(l.row_bytes(c)) / double(l.row[size_t(c)]);
}

// Fills `cache` to `depth` positions with random K/V rows (unit Gaussian, as after Gemma 4's K/V norms) instead of
// running the model: a decode step's time does not depend on the values, and a prefill to 32K positions would
// take tens of minutes on a few cores (attention grows with the square of the length).
void fill_random(const Gemma4Model& model, KvCache& cache, int64_t depth, int64_t chunk) {
  const KvLayout& l = cache.layout();
  const int64_t row = *std::max_element(l.row.begin(), l.row.end()), distinct = 61;  // rows to draw from
  std::vector<float> rows(distinct * row);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (float& x : rows) x = normal(rng);
  const auto ids = bench_tokens(model.config().text, depth, 7);
  for (int64_t s = 0; s < depth; s += chunk)
    cache.append(std::span(ids).subspan(s, std::min(chunk, depth - s)), [&](int64_t layer, int kv, int64_t j) {
      return rows.data() + (s + j + 17 * kv + layer) % distinct * row;
    });
}

void finish_row(BenchRow& row, double bandwidth) {
  row.tokens_per_second = median(row.runs);
  const double bytes_per_token = double(row.weight_bytes_per_token + row.kv_bytes_per_token);
  row.bytes_per_second = bytes_per_token * row.tokens_per_second;
  row.bandwidth_fraction = bandwidth > 0 ? row.bytes_per_second / bandwidth : 0;
  if (row.step_sweeps.empty()) return;
  // What the sweeps say the machine could read during the steps: each step's seconds at its own sweep's rate.
  double seconds = 0, could_read = 0;
  for (size_t i = 0; i < row.step_sweeps.size(); ++i)
    seconds += row.step_seconds[i], could_read += row.step_seconds[i] * row.step_sweeps[i];
  row.paired_bandwidth = could_read / seconds;
  row.paired_fraction = bytes_per_token * double(row.streams) * double(row.step_sweeps.size()) / could_read;
}

// The cache dtypes of a bench: the list given, else the precision's default; and their bytes read per token.
struct KvVariant {
  KvDtype dtype;
  ReadBytes bytes;
};

// MoE models: the bytes of the experts the tokens chose, as the model counted them, per token of a row.
uint64_t chosen_expert_bytes(uint64_t bytes, int64_t tokens) { return bytes / uint64_t(tokens); }

// One row per KV dtype; each repeat runs them in turn (A, B, A, B, ...), so that drift in the machine's load
// reaches every dtype alike. The model's KV dtype is left at the last one.
std::vector<BenchRow> prefill_rows(Gemma4Model& model, std::span<const KvVariant> kv, const BenchOptions& o,
                                   int64_t prompt) {
  std::vector<BenchRow> rows;
  std::vector<uint64_t> experts(kv.size(), 0);
  for (const KvVariant& k : kv)
    rows.push_back({.phase = "prefill", .tokens = prompt, .kv_dtype = std::string(kv_dtype_name(k.dtype)),
                    .weight_bytes_per_token = k.bytes.prefill_weights_per_token(prompt, o.prefill_chunk,
                                                                                k.bytes.num_experts == 0),
                    .kv_bytes_per_token = k.bytes.prefill_kv_per_token(prompt, o.prefill_chunk)});
  for (int r = 0; r < o.repeat; ++r)
    for (size_t i = 0; i < kv.size(); ++i) {
      model.set_kv_dtype(kv[i].dtype);
      auto ids = bench_tokens(model.config().text, prompt, r + 1);
      KvCache cache = model.new_cache(prompt);
      const uint64_t experts_before = model.expert_bytes_read();
      auto t0 = Clock::now();
      prefill(model, ids, cache, o.prefill_chunk);
      rows[i].runs.push_back(double(prompt) / seconds_since(t0));
      experts[i] += model.expert_bytes_read() - experts_before;
    }
  for (size_t i = 0; i < kv.size(); ++i)
    if (kv[i].bytes.num_experts > 0) rows[i].weight_bytes_per_token += chosen_expert_bytes(experts[i], prompt * o.repeat);
  return rows;
}

// `streams` copies of each base cache (one per KV dtype, in `kv`'s order) decode `steps` tokens each, one
// forward_batch call per step; the dtypes in turn within each repeat.
std::vector<BenchRow> decode_rows(const Gemma4Model& model, std::span<const KvVariant> kv, const BenchOptions& o,
                                  const std::vector<KvCache>& bases, int64_t streams, ReadSweep* paired) {
  const int64_t depth = bases.front().length(), steps = o.decode_tokens;
  std::vector<BenchRow> rows;
  std::vector<uint64_t> experts(kv.size(), 0);
  for (const KvVariant& k : kv)
    rows.push_back({.phase = "decode", .streams = streams, .depth = depth,
                    .kv_dtype = std::string(kv_dtype_name(k.dtype)),
                    .weight_bytes_per_token = k.bytes.decode_weights_per_token(streams, k.bytes.num_experts == 0),
                    .kv_bytes_per_token = k.bytes.decode_kv_per_token(depth, steps)});
  for (int r = 0; r < o.repeat; ++r)
    for (size_t v = 0; v < kv.size(); ++v) {
      std::vector<KvCache> caches(streams, bases[v]);
      std::vector<std::vector<int32_t>> ids;
      for (int64_t s = 0; s < streams; ++s) ids.push_back(bench_tokens(model.config().text, steps, 1000 + s));
      std::vector<SequenceStep> batch(streams);
      const uint64_t experts_before = model.expert_bytes_read();
      double seconds = 0;
      for (int64_t i = 0; i < steps; ++i) {
        for (int64_t s = 0; s < streams; ++s)
          batch[s] = {std::span(ids[s]).subspan(i, 1), &caches[s], LogitsWanted::Last};
        auto t0 = Clock::now();
        model.forward_batch(batch);
        const double step = seconds_since(t0);
        seconds += step;
        if (!paired) continue;
        rows[v].step_seconds.push_back(step);
        rows[v].step_sweeps.push_back(paired->pass());
      }
      rows[v].runs.push_back(double(streams * steps) / seconds);
      experts[v] += model.expert_bytes_read() - experts_before;
    }
  for (size_t v = 0; v < kv.size(); ++v)
    if (kv[v].bytes.num_experts > 0)
      rows[v].weight_bytes_per_token += chosen_expert_bytes(experts[v], streams * steps * o.repeat);
  return rows;
}

// |difference|, greedy agreement and mean KL(exact || approx) of two runs' logits over the same positions.
LogitError compare_logits(const std::vector<float>& exact, const std::vector<float>& approx, int64_t vocab,
                          int64_t positions) {
  const int64_t V = vocab;
  LogitError e{.positions = positions};
  for (int64_t p = 0; p < positions; ++p) {
    const float *a = exact.data() + p * V, *b = approx.data() + p * V;
    e.top1_agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    const auto [lo, hi] = std::minmax_element(a, a + V);
    e.exact_spread += (*hi - *lo) / double(positions);
    double za = 0, zb = 0, kl = 0;  // softmax normalisers, then KL(a || b)
    const double ma = *hi, mb = *std::max_element(b, b + V);
    for (int64_t v = 0; v < V; ++v) za += std::exp(a[v] - ma), zb += std::exp(b[v] - mb);
    for (int64_t v = 0; v < V; ++v) {
      const double la = a[v] - ma - std::log(za), lb = b[v] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
      const double d = std::fabs(double(a[v]) - b[v]);
      e.max_abs = std::max(e.max_abs, d);
      e.mean_abs += d / double(V * positions);
    }
    e.mean_kl += kl / double(positions);
  }
  return e;
}

// Every logit of one `positions`-token prompt, run into a fresh cache of the model's KV dtype.
std::vector<float> prompt_logits(const Gemma4Model& model, int64_t positions) {
  KvCache cache = model.new_cache(positions);
  return model.forward(bench_tokens(model.config().text, positions, 99), cache, true);
}

// int8 against bf16 on one `positions`-token prompt, all logits of each.
LogitError int8_logit_error(Gemma4Model& model, int64_t positions) {
  model.set_precision(Precision::BF16);
  const std::vector<float> exact = prompt_logits(model, positions);
  model.set_precision(Precision::Int8);
  return compare_logits(exact, prompt_logits(model, positions), model.config().text.vocab_size, positions);
}

// A KV dtype against the reference one (the precision's default), on the same weights and prompt.
LogitError kv_logit_error(Gemma4Model& model, KvDtype dtype, KvDtype reference, int64_t positions) {
  model.set_kv_dtype(reference);
  const std::vector<float> exact = prompt_logits(model, positions);
  model.set_kv_dtype(dtype);
  return compare_logits(exact, prompt_logits(model, positions), model.config().text.vocab_size, positions);
}

// Beside the first dtype's bytes a value, the others' (int8: with its share of the scales).
std::string kv_bytes_note(const BenchReport& r) {
  std::string s;
  for (size_t i = 1; i < r.kv_dtypes.size(); ++i)
    s += fmt::format("; {}: {:.3f}", r.kv_dtypes[i], r.kv_element_bytes_each[i]);
  return r.kv_dtypes.size() > 1 ? fmt::format(" ({}{})", r.kv_dtypes[0], s) : s;
}

std::vector<std::string> bench_notes(const BenchOptions& o, const BenchReport& r, const ReadBytes& rb) {
  std::vector<std::string> notes = {
      "weights/token: every linear of every layer, norms, the tied LM head (once per call that returns logits) "
      "and the per-token gathers (embedding row, per-layer-embedding row), as stored in the checkpoint; a decode "
      "step reads them once for all its streams",
      r.lm_head == "int4" ? fmt::format("LM head: int4 in memory, {:.1f} MB a call (the tied embedding lies on the "
                                        "QAT grid, so its repack at load is lossless: the same logits as bf16)",
                                        double(rb.lm_head) / 1e6)
                          : fmt::format("LM head: the bf16 tied embedding, {:.1f} MB a call", double(rb.lm_head) / 1e6),
      fmt::format("KV/token: K and V of every attended position in every layer (KV-shared layers re-read their "
                  "donor's cache), {:.0f} bytes a value{}",
                  r.kv_element_bytes, kv_bytes_note(r)),
      fmt::format("prefill: chunks of {} tokens, logits for the last token only; rows without logits stop before "
                  "the KV-shared layers (from layer {}); prefill is compute-bound, so its bandwidth share is low",
                  o.prefill_chunk, rb.first_shared),
      fmt::format("decode: {} timed steps per row after a warm-up call; depth D: one cache {} to D positions "
                  "and copied to every stream",
                  o.decode_tokens, o.random_fill ? "filled with random K/V rows (not the model's: --fill random)"
                                                 : "prefilled"),
      fmt::format("bandwidth: read-only sweep of {} MiB with {} loads on {} threads, best of {} passes, before and "
                  "after the rows (the better kept)",
                  r.bandwidth.buffer_bytes >> 20, r.bandwidth.isa, r.bandwidth.threads, r.bandwidth.passes)};
  if (rb.num_experts > 0)
    notes.push_back(fmt::format("experts: the bytes of the experts the tokens actually chose ({} of {} each), as "
                                "the model counts them: every chosen expert's weights once per call and layer",
                                rb.top_k, rb.num_experts));
  if (o.repeat > 1) notes.push_back(fmt::format("tokens/s: median of {} runs", o.repeat));
  if (r.paired_sweep_bytes > 0)
    notes.push_back(fmt::format("of paired sweep: after every timed decode step (not counted in tokens/s) the "
                                "threads read {} MiB once more; the bytes the row's steps read over what the machine "
                                "read in the same seconds at each step's sweep rate, and that rate: each step beside "
                                "the bandwidth of its own moment",
                                r.paired_sweep_bytes >> 20));
  if (r.kv_dtypes.size() > 1)
    notes.push_back(fmt::format("KV dtypes {}: each row once per dtype, the runs of a repeat in turn (A, B, A, B, ...)",
                                fmt::join(r.kv_dtypes, ", ")));
  for (const KvError& k : r.kv_errors)
    notes.push_back(fmt::format(
        "{} KV cache against {} on the same weights and activations, every position of a {}-token prompt: "
        "|logit difference| max {:.4f}, mean {:.5f} (exact logits span {:.2f} on average); greedy token the same at "
        "{} of {}; mean KL({} || {}) {:.2e} nats",
        k.dtype, k.reference, k.error.positions, k.error.max_abs, k.error.mean_abs, k.error.exact_spread,
        k.error.top1_agree, k.error.positions, k.reference, k.dtype, k.error.mean_kl));
  if (r.int8_error)
    notes.push_back(fmt::format(
        "int8 (W4A8: the int4 linears quantize their inputs to int8 per group of 32) against bf16 on the same weights, "
        "every position of a {}-token prompt: |logit difference| max {:.4f}, mean {:.5f} (exact logits span {:.2f} "
        "on average); greedy token the same at {} of {}; mean KL(bf16 || int8) {:.2e} nats",
        r.int8_error->positions, r.int8_error->max_abs, r.int8_error->mean_abs, r.int8_error->exact_spread,
        r.int8_error->top1_agree, r.int8_error->positions, r.int8_error->mean_kl));
  return notes;
}

std::vector<std::string> speculative_notes(const BenchReport& r, const ReadBytes& rb) {
  const SpeculativeReport& s = *r.speculative;
  std::vector<std::string> notes = {
      fmt::format("speculative ({}): one stream, greedy (eos ignored), a {}-token prompt of one 32-token segment "
                  "repeated (prompt lookup finds its continuation there), {} tokens; every run through the engine "
                  "(Generator: the drafter, one verify step, Sampler::verify, the cache truncated to what was "
                  "accepted), plain decoding and each k in turn within every repeat; tokens/s = (tokens - 1) / the "
                  "time after the first token, which comes from the prefill",
                  s.drafter, s.prompt_tokens, s.decode_tokens),
      "acceptance = accepted / proposed draft tokens; tokens/round = 1 + accepted / rounds that verified a draft "
      "(a step where the drafter had nothing is a plain step); same ids: the speculative run's greedy ids equal plain "
      "decoding's in every repeat",
      fmt::format("round costs at the prompt's end, medians of at least 5 turns (a step, then each k's draft and verify), every call undone: draft = "
                  "the drafter proposing k tokens (assistant: k steps of its decoder over the target's K/V; draft "
                  "model: its k forward calls; prompt lookup: a search of the history); verify = one target call over "
                  "k + 1 positions, logits for all{}, reading the weights once for all of them; weights read by "
                  "one step: {:.1f} MB (LM head {:.1f} MB)",
                  s.method == "assistant" ? " and final hidden states (what the assistant reads)" : "",
                  double(s.step_weight_bytes) / 1e6, double(rb.lm_head) / 1e6),
      "projection: NOT a measurement: drafts accepted independently with probability a (Leviathan et al. 2023) give "
      "(1 - a^(k+1)) / (1 - a) tokens a round, which takes draft(k) + verify(k + 1) as measured; speedup = tokens a "
      "round x step / (draft + verify). Engine overhead between calls is left out: compare 'projected' with 'ratio'",
      fmt::format("bandwidth: read-only sweep of {} MiB with {} loads on {} threads, best of {} passes",
                  r.bandwidth.buffer_bytes >> 20, r.bandwidth.isa, r.bandwidth.threads, r.bandwidth.passes)};
  if (s.scripted_acceptance)
    notes.insert(notes.begin() + 1,
                 fmt::format("scripted drafts (--draft-acceptance {0}): the drafter ran (its time counts), then each of "
                             "its tokens was made plain greedy decoding's token at that position with probability {0}, "
                             "independently, else another id; the target's verification accepted the right ones up "
                             "to the first wrong one, so the rows measure the engine at that per-token agreement (the "
                             "projection's a, which 'projected at its acceptance' then uses), not the drafter's own",
                             *s.scripted_acceptance));
  return notes;
}

}  // namespace

BenchReport run_bench(const BenchOptions& o, const std::function<void(const std::string&)>& log_fn) {
  auto log = [&](const std::string& s) { if (log_fn) log_fn(s); };
  if (o.decode_tokens < 1 || o.prefill_chunk < 1 || o.repeat < 1) throw Error("bench: counts must be positive");
  ThreadPool::set_shared_threads(o.threads);
  if (!o.isa.empty()) set_kernel_isa(parse_isa(o.isa));
  ThreadPool& pool = ThreadPool::shared();
  BenchReport r;
  r.threads = pool.size();
  log(fmt::format("bandwidth sweep over {} MiB on {} threads", o.sweep_bytes >> 20, r.threads));
  r.bandwidth = measure_read_bandwidth(pool, o.sweep_bytes);
  std::optional<ReadSweep> paired;
  if (o.paired_sweep_bytes > 0) paired.emplace(pool, o.paired_sweep_bytes);
  r.paired_sweep_bytes = paired ? paired->bytes() : 0;

  if (o.kv_error_positions < 1) throw Error("bench: --kv-error-positions must be positive");
  if (!o.loras.empty() && o.speculative.enabled()) throw Error("bench: --lora and --speculative are separate runs");
  auto model = Gemma4Model::load(o.model, parse_precision(o.precision), true);
  const Gemma4TextConfig& c = model->config().text;
  const int64_t max_depth = o.depths.empty() ? 0 : *std::max_element(o.depths.begin(), o.depths.end());
  const int64_t context = (o.speculative.enabled() ? o.speculative_prompt : max_depth) + o.decode_tokens;
  for (int64_t p : o.speculative.enabled() ? std::vector<int64_t>{0} : o.prompts)
    if (std::max(p, context) > c.max_position_embeddings_or(INT64_MAX))
      throw Error(fmt::format("bench: {} positions exceed the model's {}", std::max(p, context),
                              c.max_position_embeddings_or(INT64_MAX)));
  r.model = o.model.string();
  r.precision = o.precision;
  r.int4_weights = model->int4_weights();
  r.decode_tokens = o.decode_tokens;
  r.prefill_chunk = o.prefill_chunk;
  r.repeat = o.repeat;
  const KvDtype default_kv = model->kv_dtype();
  std::vector<KvVariant> kv;
  for (const std::string& name : o.kv_dtypes.empty() ? std::vector<std::string>{std::string(kv_dtype_name(default_kv))}
                                                     : o.kv_dtypes) {
    const KvDtype d = parse_kv_dtype(name);
    kv.push_back({d, read_bytes(model->checkpoint(), model->config(), d, model->lm_head().bytes())});
    r.kv_dtypes.emplace_back(kv_dtype_name(d));
    r.kv_element_bytes_each.push_back(kv_element_bytes(*model, d));
  }
  r.kv_element_bytes = r.kv_element_bytes_each.front();
  r.lm_head = model->lm_head().kind == WeightKind::Int4 ? "int4" : "bf16";
  const Int4Layout layout = model->lm_head().kind == WeightKind::Int4 ? model->lm_head().layout : Int4Layout::Rows;
  r.int4_layout = int4_layout_name(layout);
  r.isa = isa_name(kernel_isa());
  r.bf16_dot_products = multiplies_by_bf16_dot_products(activations_of(model->precision()));

  if (model->precision() == Precision::Int8) {
    r.int8_error = int8_logit_error(*model, std::min<int64_t>(64, c.max_position_embeddings_or(64)));
    log(fmt::format("int8 logit error measured over {} positions", r.int8_error->positions));
  }
  for (const KvVariant& k : kv)
    if (k.dtype != default_kv) {
      const int64_t n = std::min<int64_t>(o.kv_error_positions, c.max_position_embeddings_or(o.kv_error_positions));
      r.kv_errors.push_back({std::string(kv_dtype_name(k.dtype)), std::string(kv_dtype_name(default_kv)),
                             kv_logit_error(*model, k.dtype, default_kv, n)});
      log(fmt::format("{} KV logit error measured over {} positions", kv_dtype_name(k.dtype), n));
    }
  {  // Warm-up: the first call faults the mapped weights in; no row should pay for that.
    KvCache warm = model->new_cache(1);
    auto t0 = Clock::now();
    model->forward(bench_tokens(c, 1, 0), warm, false);
    log(fmt::format("warm-up call: {:.2f} s", seconds_since(t0)));
  }
  auto log_rows = [&](size_t count, const std::string& what) {
    for (size_t i = r.rows.size() - count; i < r.rows.size(); ++i)
      log(fmt::format("{} ({} KV): {:.2f} tokens/s", what, r.rows[i].kv_dtype, median(r.rows[i].runs)));
  };
  if (o.speculative.enabled()) r.speculative = speculative_bench(*model, o, kv.front().bytes, log);
  if (!o.loras.empty()) r.lora = lora_bench(*model, o, log);
  const bool plain_rows = !r.speculative && !r.lora;
  for (int64_t p : plain_rows ? o.prompts : std::vector<int64_t>{}) {
    for (BenchRow& row : prefill_rows(*model, kv, o, p)) r.rows.push_back(std::move(row));
    log_rows(kv.size(), fmt::format("prefill {} tokens", p));
  }
  for (int64_t depth : plain_rows ? o.depths : std::vector<int64_t>{}) {
    std::vector<KvCache> bases;
    auto t0 = Clock::now();
    for (const KvVariant& k : kv) {
      model->set_kv_dtype(k.dtype);
      bases.push_back(model->new_cache(context));
      if (depth > 0 && o.random_fill) fill_random(*model, bases.back(), depth, o.prefill_chunk);
      else if (depth > 0) prefill(*model, bench_tokens(c, depth, 7), bases.back(), o.prefill_chunk);
    }
    if (depth > 0) log(fmt::format("filled {} cache(s) to depth {} in {:.1f} s", kv.size(), depth, seconds_since(t0)));
    for (int64_t n : o.streams) {
      for (BenchRow& row : decode_rows(*model, kv, o, bases, n, paired ? &*paired : nullptr))
        r.rows.push_back(std::move(row));
      log_rows(kv.size(), fmt::format("decode {} streams at depth {}", n, depth));
    }
  }
  BandwidthResult again = measure_read_bandwidth(pool, o.sweep_bytes);  // drift during the rows shows up here
  if (again.bytes_per_second > r.bandwidth.bytes_per_second) r.bandwidth = again;
  for (BenchRow& row : r.rows) finish_row(row, r.bandwidth.bytes_per_second);
  r.notes = r.speculative ? speculative_notes(r, kv.front().bytes)
            : r.lora ? std::vector<std::string>{"each row's runs alternate base and adapters (base, adapters, adapters, "
                                                "base, ...); tokens/s are medians over --repeat"}
                     : bench_notes(o, r, kv.front().bytes);
  return r;
}

}  // namespace qs
