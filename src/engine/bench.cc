#include "engine/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>

#include "engine/generator.h"
#include "engine/speculative.h"
#include "formats/checkpoint.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/gemma4_tensors.h"
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

// ---- bytes per token ----

namespace {

// Fraction of a layer's experts that `n` tokens touch, each picking k of E uniformly.
double experts_touched(int64_t n, int64_t k, int64_t e) {
  return e == 0 || n == 0 ? 0.0 : 1.0 - std::pow(1.0 - double(k) / double(e), double(n));
}

}  // namespace

uint64_t ReadBytes::call_weights(int64_t rows, int64_t wanted, bool with_experts) const {
  if (rows == 0) return 0;
  double b = double(model_linears);
  for (size_t l = 0; l < layer_dense.size(); ++l) {
    const int64_t n = int64_t(l) < first_shared ? rows : wanted;  // later layers see only the wanted rows
    if (n == 0) continue;
    b += double(layer_dense[l]);
    if (with_experts) b += double(layer_experts[l]) * experts_touched(n, top_k, num_experts);
  }
  if (wanted > 0) b += double(lm_head);
  return static_cast<uint64_t>(std::llround(b));
}

uint64_t ReadBytes::kv_read(int64_t position, bool all_layers) const {
  const int64_t end = all_layers ? int64_t(layer_kv_row.size()) : first_shared;
  uint64_t b = 0;
  for (int64_t l = 0; l < end; ++l) {
    const int64_t attended = layer_window[l] ? std::min(position + 1, layer_window[l]) : position + 1;
    b += layer_kv_row[l] * uint64_t(attended);
  }
  return b;
}

uint64_t ReadBytes::decode_weights_per_token(int64_t streams, bool with_experts) const {
  return call_weights(streams, streams, with_experts) / uint64_t(streams) + gather;
}

uint64_t ReadBytes::decode_kv_per_token(int64_t depth, int64_t steps) const {
  uint64_t sum = 0;
  for (int64_t i = 0; i < steps; ++i) sum += kv_read(depth + i, true);
  return steps ? sum / uint64_t(steps) : 0;
}

uint64_t ReadBytes::prefill_weights_per_token(int64_t prompt, int64_t chunk, bool with_experts) const {
  uint64_t sum = 0;
  for (int64_t s = 0; s < prompt; s += chunk) {
    const int64_t m = std::min(chunk, prompt - s);
    sum += call_weights(m, s + m == prompt ? 1 : 0, with_experts);
  }
  return sum / uint64_t(prompt) + gather;
}

uint64_t ReadBytes::prefill_kv_per_token(int64_t prompt, int64_t chunk) const {
  // Rows that return no logits stop before the KV-shared layers; the prompt's last row goes through them all.
  uint64_t sum = kv_read(prompt - 1, true) - kv_read(prompt - 1, false);
  for (int64_t p = 0; p < prompt; ++p) sum += kv_read(p, false);
  return sum / uint64_t(prompt);
}

ReadBytes read_bytes(const Checkpoint& checkpoint, const ModelConfig& config, KvDtype kv_dtype,
                     std::optional<uint64_t> lm_head_bytes) {
  const Gemma4TextConfig& c = config.text;
  const int64_t L = c.num_hidden_layers;
  ReadBytes r;
  r.layer_dense.assign(L, 0);
  r.layer_experts.assign(L, 0);
  r.first_shared = c.num_kv_shared_layers > 0 ? c.first_shared_layer() : L;
  r.num_experts = c.enable_moe_block ? c.num_experts : 0;
  r.top_k = c.top_k_experts;
  r.gather = uint64_t(c.hidden_size) * 2 + (c.has_ple() ? uint64_t(L * c.hidden_size_per_layer_input) * 2 : 0);
  for (int64_t l = 0; l < L; ++l) {
    r.layer_kv_row.push_back(2 * kv_row_bytes(kv_dtype, c.layer_kv_heads(l), c.layer_head_dim(l)));
    r.layer_window.push_back(c.is_full(l) ? 0 : c.sliding_window);
  }

  const ArchTensorIndex index(config);
  for (const TensorRef& t : checkpoint.tensors()) {
    const ArchTensor* a = index.find(t.name());
    if (!a) continue;  // towers, k/v of KV-shared layers, a redundant lm_head: never read
    switch (a->role) {
      case TensorRole::Embedding: r.lm_head += t.nbytes(); break;  // tied: the whole table is the LM head
      case TensorRole::PerLayerEmbedding: break;                    // gathered a row per token (in `gather`)
      case TensorRole::FusedExperts: r.layer_experts[a->layer] += t.nbytes(); break;
      default: (a->layer >= 0 ? r.layer_dense[a->layer] : r.model_linears) += t.nbytes();
    }
  }
  if (lm_head_bytes) r.lm_head = *lm_head_bytes;
  return r;
}

double expected_tokens_per_round(double alpha, int64_t k) {
  return alpha >= 1 ? double(k + 1) : (1 - std::pow(alpha, double(k + 1))) / (1 - alpha);
}

double projected_speedup(double alpha, const RoundCost& cost, double step_seconds) {
  return expected_tokens_per_round(alpha, cost.k) * step_seconds / (cost.draft_seconds + cost.verify_seconds);
}

// ---- running ----

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Deterministic token ids spread over the vocabulary (and inside the per-layer-embedding table).
std::vector<int32_t> bench_tokens(const Gemma4TextConfig& c, int64_t n, int64_t salt) {
  const int64_t limit = c.has_ple() ? std::min(c.vocab_size, c.vocab_size_per_layer_input) : c.vocab_size;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(10 + (i * 7919 + salt * 104729) % (limit - 10));
  return ids;
}

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

// ---- speculative decoding ----

// The speculative rows' prompt: one 32-token segment over and over, so that prompt lookup finds what follows.
std::vector<int32_t> copy_prompt(const Gemma4TextConfig& c, int64_t length) {
  const std::vector<int32_t> segment = bench_tokens(c, 32, 11);
  std::vector<int32_t> ids(length);
  for (int64_t i = 0; i < length; ++i) ids[i] = segment[i % 32];
  return ids;
}

// The drafter models a speculative bench loads beside the target (none for prompt lookup).
struct DrafterModels {
  std::unique_ptr<Gemma4Model> draft_model;
  std::unique_ptr<Gemma4Assistant> assistant;
};

SamplingParams greedy_sampling() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

GenerationRequest greedy_request(const std::vector<int32_t>& prompt, int64_t tokens, const SpeculativeConfig& spec) {
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = tokens;
  req.sampling = greedy_sampling();
  req.ignore_eos = true;
  req.speculative = spec;
  return req;
}

// The first token comes from the prefill; the rest from decode steps (or rounds).
double decode_speed(const GenerationResult& g) { return double(g.tokens.size() - 1) / g.decode_seconds; }

std::vector<int32_t> ids_of(const GenerationResult& g) {
  std::vector<int32_t> ids;
  for (const SampledToken& t : g.tokens) ids.push_back(t.id);
  return ids;
}

// --draft-acceptance: the drafter proposes as usual (its time counts), then each proposed token becomes the token
// plain greedy decoding gave at its position with probability `acceptance`, independently, else the next id. The
// target's verification accepts exactly the right ones up to the first wrong one, as with a drafter of that
// per-token agreement (what the projection assumes).
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::unique_ptr<Drafter> drafter, const std::vector<int32_t>& greedy, double acceptance,
                  int64_t vocab, uint32_t run)
      : drafter_(std::move(drafter)), greedy_(greedy), acceptance_(acceptance), vocab_(vocab) {
    std::seed_seq seed{run};  // the raw small seeds 1, 2, ... gave runs of agreement well above the asked probability
    random_.seed(seed);
  }
  Draft propose(const DraftContext& ctx) override {
    Draft d = drafter_->propose(ctx);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      const size_t at = ctx.tokens.size() + i;
      if (at >= greedy_.size()) break;  // past the run's end: left as drafted
      const bool agree = std::uniform_real_distribution<double>(0, 1)(random_) < acceptance_;
      d.tokens[i] = agree ? greedy_[at] : static_cast<int32_t>((greedy_[at] + 1) % vocab_);
    }
    return d;
  }
  bool wants_target_hidden() const override { return drafter_->wants_target_hidden(); }

 private:
  std::unique_ptr<Drafter> drafter_;
  const std::vector<int32_t>& greedy_;  // the prompt, then plain greedy decoding's output
  double acceptance_;
  int64_t vocab_;
  std::mt19937_64 random_;
};

// Plain greedy decoding, then with the drafter at each k, in turn within each repeat (A, B, C, A, B, C, ...), all
// through the engine (Generator): its rounds are the engine's own (the drafter's proposal, one verify step,
// Sampler::verify, the cache truncated to what was accepted).
void speculative_rows(const Gemma4Model& model, const DrafterModels& d, const BenchOptions& o,
                      const std::vector<int32_t>& prompt, SpeculativeReport& s) {
  Generator generator(model, nullptr, GenerationConfig{}, d.draft_model.get(), d.assistant.get());
  std::vector<int32_t> greedy;  // what --draft-acceptance scripts the drafts from
  uint32_t runs = 0;  // each speculative run draws from a generator of its own
  if (o.draft_acceptance)
    generator.wrap_drafters([&](std::unique_ptr<Drafter> drafter) -> std::unique_ptr<Drafter> {
      return std::make_unique<ScriptedDrafter>(std::move(drafter), greedy, *o.draft_acceptance,
                                               model.config().text.vocab_size, ++runs);
    });
  for (int64_t k : o.speculative_tokens) s.rows.push_back({.k = k});
  for (int r = 0; r < o.repeat; ++r) {
    const GenerationResult plain = generator.run(greedy_request(prompt, o.decode_tokens, {}));
    s.plain_runs.push_back(decode_speed(plain));
    greedy = prompt;
    for (int32_t id : ids_of(plain)) greedy.push_back(id);
    for (SpeculativeRow& row : s.rows) {
      SpeculativeConfig spec = o.speculative;
      spec.num_speculative_tokens = row.k;
      const GenerationResult g = generator.run(greedy_request(prompt, o.decode_tokens, spec));
      row.runs.push_back(decode_speed(g));
      row.rounds += g.drafts;
      row.draft_tokens += g.draft_tokens;
      row.accepted_tokens += g.accepted_tokens;
      row.same_ids = row.same_ids && ids_of(g) == ids_of(plain);
    }
  }
  s.plain_tokens_per_second = median(s.plain_runs);
  for (SpeculativeRow& row : s.rows) {
    row.tokens_per_second = median(row.runs);
    row.ratio = row.tokens_per_second / s.plain_tokens_per_second;
  }
}

template <class Call>
double seconds_of(Call&& call) {
  auto t0 = Clock::now();
  call();
  return seconds_since(t0);
}

// A round's parts at the prompt's end, each call undone (KvCache::truncate) so that every one sees the same cache:
// one plain step, and for k = 1 .. the largest k the drafter proposing k tokens and one target call verifying
// k + 1 positions (the last token and k drafts; its cost does not depend on which tokens they are). The calls take
// turns (step, then each k's draft and verify, again and again), so that the machine's load reaches them alike;
// medians of at least 5 turns.
void round_costs(const Gemma4Model& model, const DrafterModels& d, const BenchOptions& o,
                 const std::vector<int32_t>& prompt, const ReadBytes& rb, SpeculativeReport& s) {
  const int64_t max_k = *std::max_element(o.speculative_tokens.begin(), o.speculative_tokens.end());
  const int64_t context = static_cast<int64_t>(prompt.size()) + max_k + 2;
  KvCache cache = model.new_cache(context, max_k + 1, d.assistant ? d.assistant->sliding_kept() : 0);
  std::vector<float> hidden;  // the target's final hidden state at the prompt's last position (the assistant's)
  const SequenceStep first{prompt, &cache, LogitsWanted::Last, {}, 0, &hidden};
  const std::vector<float> logits = model.forward_batch(std::span(&first, 1));
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  const int64_t length = cache.length();
  const bool with_hidden = o.speculative.method == SpeculativeMethod::Assistant;  // as the engine asks for it
  auto target_call = [&](std::span<const int32_t> ids, LogitsWanted wanted, bool wants_hidden) {
    std::vector<float> h;
    const SequenceStep step{ids, &cache, wanted, {}, static_cast<int64_t>(ids.size()), wants_hidden ? &h : nullptr};
    model.forward_batch(std::span(&step, 1));
    cache.truncate(length);
  };
  Sampler sampler(greedy_sampling());
  const int turns = std::max(5, o.repeat);
  std::vector<std::unique_ptr<Drafter>> drafters;
  std::vector<std::vector<int32_t>> verified;  // per k: the last token and k more
  for (int64_t k = 1; k <= max_k; ++k) {
    SpeculativeConfig spec = o.speculative;
    spec.num_speculative_tokens = k;
    drafters.push_back(make_drafter(spec, model, d.draft_model.get(), context + turns, d.assistant.get()));
    verified.push_back(bench_tokens(model.config().text, k + 1, 3));
    verified.back().front() = tokens.back();
  }
  // A draft model keeps a cache of what it saw and may not be asked twice about the same tokens: each turn gives
  // it one token more (a round's catch-up). Prompt lookup and the assistant see the prompt's end every turn.
  std::vector<int32_t> seen = tokens;
  const std::vector<int32_t> more = bench_tokens(model.config().text, turns, 5);
  auto context_of = [&](int64_t k) {
    return DraftContext{seen, static_cast<int64_t>(prompt.size()), k, &sampler, hidden, &cache};
  };
  for (int64_t k = 1; k <= max_k; ++k) drafters[k - 1]->propose(context_of(k));  // a draft model runs the prompt
  std::vector<double> step;
  std::vector<std::vector<double>> draft(max_k), verify(max_k);
  for (int turn = 0; turn < turns; ++turn) {
    if (d.draft_model) seen.push_back(more[turn]);
    step.push_back(seconds_of([&] { target_call(std::span(tokens).last(1), LogitsWanted::Last, false); }));
    for (int64_t k = 1; k <= max_k; ++k) {
      draft[k - 1].push_back(seconds_of([&] { drafters[k - 1]->propose(context_of(k)); }));
      verify[k - 1].push_back(seconds_of([&] { target_call(verified[k - 1], LogitsWanted::All, with_hidden); }));
    }
  }
  s.step_seconds = median(step);
  s.step_weight_bytes = rb.call_weights(1, 1) + rb.gather;
  for (int64_t k = 1; k <= max_k; ++k)
    s.costs.push_back({.k = k, .draft_seconds = median(draft[k - 1]), .verify_seconds = median(verify[k - 1]),
                       .verify_weight_bytes = rb.call_weights(k + 1, k + 1) + uint64_t(k + 1) * rb.gather});
}

std::string drafter_name(const BenchOptions& o) {
  switch (o.speculative.method) {
    case SpeculativeMethod::Assistant: return "assistant " + o.assistant.string();
    case SpeculativeMethod::DraftModel: return "draft model " + o.draft_model.string();
    default:
      return fmt::format("prompt lookup, n = {}..{}", o.speculative.prompt_lookup_min, o.speculative.prompt_lookup_max);
  }
}

SpeculativeReport speculative_bench(const Gemma4Model& model, const BenchOptions& o, const ReadBytes& rb,
                                    const std::function<void(const std::string&)>& log) {
  if (o.decode_tokens < 2) throw Error("bench --speculative: --decode-tokens must be at least 2");
  if (o.speculative_prompt < 1) throw Error("bench --speculative: the prompt must have at least one token");
  if (o.draft_acceptance && !(*o.draft_acceptance >= 0 && *o.draft_acceptance <= 1))
    throw Error(fmt::format("bench --draft-acceptance: {} is not a probability (0 to 1)", *o.draft_acceptance));
  for (int64_t k : o.speculative_tokens) {
    SpeculativeConfig spec = o.speculative;
    spec.num_speculative_tokens = k;
    spec.validate();  // names the field and its range
  }
  DrafterModels d;
  if (!o.draft_model.empty()) d.draft_model = Gemma4Model::load(o.draft_model, model.precision(), true);
  if (!o.assistant.empty()) d.assistant = Gemma4Assistant::load(o.assistant, model, true);
  make_drafter(o.speculative, model, d.draft_model.get(), 1, d.assistant.get());  // throws naming what is missing
  SpeculativeReport s{.method = std::string(speculative_method_name(o.speculative.method)),
                      .drafter = drafter_name(o),
                      .prompt_tokens = o.speculative_prompt,
                      .decode_tokens = o.decode_tokens,
                      .scripted_acceptance = o.draft_acceptance};
  const std::vector<int32_t> prompt = copy_prompt(model.config().text, o.speculative_prompt);
  round_costs(model, d, o, prompt, rb, s);
  log(fmt::format("round costs measured: one step {:.2f} ms", 1e3 * s.step_seconds));
  speculative_rows(model, d, o, prompt, s);
  for (const SpeculativeRow& row : s.rows)
    log(fmt::format("speculative k={}: {:.2f} tokens/s against {:.2f} plain, acceptance {:.2f}", row.k,
                    row.tokens_per_second, s.plain_tokens_per_second, row.acceptance()));
  return s;
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
  for (int64_t p : r.speculative ? std::vector<int64_t>{} : o.prompts) {
    for (BenchRow& row : prefill_rows(*model, kv, o, p)) r.rows.push_back(std::move(row));
    log_rows(kv.size(), fmt::format("prefill {} tokens", p));
  }
  for (int64_t depth : r.speculative ? std::vector<int64_t>{} : o.depths) {
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
  r.notes = r.speculative ? speculative_notes(r, kv.front().bytes) : bench_notes(o, r, kv.front().bytes);
  return r;
}

// ---- output ----

namespace {

std::string decimal_bytes(double b) {
  return b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : b >= 1e6 ? fmt::format("{:.1f} MB", b / 1e6)
                                                     : fmt::format("{:.1f} kB", b / 1e3);
}

// Rows, round costs and the projection table.
std::string format_speculative(const SpeculativeReport& p) {
  std::string s = fmt::format("speculative decoding, {}{}: plain decoding {:.2f} tokens/s\n\n", p.drafter,
                              p.scripted_acceptance ? fmt::format(", drafts scripted to agree with probability {} "
                                                                  "(measured, see notes)", *p.scripted_acceptance)
                                                    : "",
                              p.plain_tokens_per_second);
  s += "| k | tokens/s | ratio | acceptance | tokens/round | projected at its acceptance | same ids as plain |\n";
  s += "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const SpeculativeRow& row : p.rows)
    s += fmt::format("| {} | {:.2f} | {:.2f}x | {:.3f} ({}/{}) | {:.2f} | {:.2f}x | {} |\n", row.k,
                     row.tokens_per_second, row.ratio, row.acceptance(), row.accepted_tokens, row.draft_tokens,
                     row.tokens_per_round(),
                     projected_speedup(p.scripted_acceptance.value_or(row.acceptance()), p.costs[row.k - 1],
                                       p.step_seconds),
                     row.same_ids ? "yes" : "NO");
  s += fmt::format("\nround costs: one plain step {:.2f} ms, {} of weights read ({:.1f} GB/s)\n\n", 1e3 * p.step_seconds,
                   decimal_bytes(double(p.step_weight_bytes)), double(p.step_weight_bytes) / p.step_seconds / 1e9);
  s += "| k | draft k tokens | verify k+1 positions | verify / step | weights read by verify | round / step |\n";
  s += "| --- | --- | --- | --- | --- | --- |\n";
  for (const RoundCost& c : p.costs)
    s += fmt::format("| {} | {:.2f} ms | {:.2f} ms | {:.2f} | {} (once for {} positions) | {:.2f} |\n", c.k,
                     1e3 * c.draft_seconds, 1e3 * c.verify_seconds, c.verify_seconds / p.step_seconds,
                     decimal_bytes(double(c.verify_weight_bytes)), c.k + 1,
                     (c.draft_seconds + c.verify_seconds) / p.step_seconds);
  s += "\nprojected speedup (NOT measured: drafts accepted i.i.d. with probability a, from the round costs above)\n\n| a |";
  for (const RoundCost& c : p.costs) s += fmt::format(" k={} |", c.k);
  s += " best k |\n| --- |";
  for (size_t i = 0; i <= p.costs.size(); ++i) s += " --- |";
  s += "\n";
  for (double a : kProjectionAlphas) {
    s += fmt::format("| {:.1f} |", a);
    const RoundCost* best = nullptr;
    for (const RoundCost& c : p.costs) {
      s += fmt::format(" {:.2f}x |", projected_speedup(a, c, p.step_seconds));
      if (!best || projected_speedup(a, c, p.step_seconds) > projected_speedup(a, *best, p.step_seconds)) best = &c;
    }
    s += fmt::format(" {} |\n", best->k);
  }
  return s + "\n";
}

nlohmann::ordered_json speculative_json(const SpeculativeReport& p) {
  nlohmann::ordered_json j = {{"method", p.method}, {"drafter", p.drafter}, {"prompt_tokens", p.prompt_tokens},
                              {"decode_tokens", p.decode_tokens}, {"plain_tokens_per_second", p.plain_tokens_per_second},
                              {"plain_runs", p.plain_runs}, {"step_seconds", p.step_seconds},
                              {"step_weight_bytes", p.step_weight_bytes}};
  if (p.scripted_acceptance) j["scripted_acceptance"] = *p.scripted_acceptance;
  j["rows"] = nlohmann::ordered_json::array();
  for (const SpeculativeRow& row : p.rows)
    j["rows"].push_back({{"k", row.k}, {"tokens_per_second", row.tokens_per_second}, {"runs", row.runs},
                         {"ratio", row.ratio}, {"rounds", row.rounds}, {"draft_tokens", row.draft_tokens},
                         {"accepted_tokens", row.accepted_tokens}, {"acceptance", row.acceptance()},
                         {"tokens_per_round", row.tokens_per_round()}, {"same_ids", row.same_ids}});
  j["round_costs"] = nlohmann::ordered_json::array();
  for (const RoundCost& c : p.costs) {
    nlohmann::ordered_json projected;
    for (double a : kProjectionAlphas) projected[fmt::format("{:.1f}", a)] = projected_speedup(a, c, p.step_seconds);
    j["round_costs"].push_back({{"k", c.k}, {"draft_seconds", c.draft_seconds}, {"verify_seconds", c.verify_seconds},
                                {"verify_weight_bytes", c.verify_weight_bytes}, {"projected_speedup", projected}});
  }
  return j;
}

}  // namespace

std::string format_bench_report(const BenchReport& r) {
  std::string s = fmt::format("qatserve bench: {} ({} weights, {} LM head, {} activations, {} kernels{}, "
                              "int4 by {}, {} threads)\n",
                              r.model, r.int4_weights ? "int4" : "bf16", r.lm_head, r.precision, r.isa,
                              r.bf16_dot_products ? " (linears: bf16 dot products)" : "", r.int4_layout, r.threads);
  s += fmt::format("memory read bandwidth: {:.1f} GB/s ({} loads, {} MiB, {} threads)\n\n",
                   r.bandwidth.bytes_per_second / 1e9, r.bandwidth.isa, r.bandwidth.buffer_bytes >> 20,
                   r.bandwidth.threads);
  if (r.speculative) s += format_speculative(*r.speculative);
  if (r.rows.empty()) {
    for (const std::string& n : r.notes) s += "- " + n + "\n";
    return s;
  }
  const bool paired = r.paired_sweep_bytes > 0;
  s += "| phase | prompt / streams | depth | KV | tokens/s | weights/token | KV/token | GB/s | of bandwidth |";
  s += paired ? " of paired sweep |\n" : "\n";
  s += "| --- | --- | --- | --- | --- | --- | --- | --- | --- |";
  s += paired ? " --- |\n" : "\n";
  for (const BenchRow& row : r.rows) {
    s += fmt::format("| {} | {} | {} | {} | {:.2f} | {} | {} | {:.2f} | {:.1f}% |", row.phase,
                     row.phase == "prefill" ? fmt::format("{} tokens", row.tokens)
                                            : fmt::format("{} stream{}", row.streams, row.streams == 1 ? "" : "s"),
                     row.phase == "prefill" ? std::string("0") : std::to_string(row.depth), row.kv_dtype,
                     row.tokens_per_second,
                     decimal_bytes(double(row.weight_bytes_per_token)), decimal_bytes(double(row.kv_bytes_per_token)),
                     row.bytes_per_second / 1e9, 100 * row.bandwidth_fraction);
    if (paired)
      s += row.step_sweeps.empty() ? std::string(" - |")
                                   : fmt::format(" {:.1f}% of {:.1f} GB/s |", 100 * row.paired_fraction,
                                                 row.paired_bandwidth / 1e9);
    s += "\n";
  }
  s += "\n";
  for (const std::string& n : r.notes) s += "- " + n + "\n";
  return s;
}

nlohmann::ordered_json bench_report_json(const BenchReport& r) {
  nlohmann::ordered_json j;
  j["model"] = r.model;
  j["weights"] = r.int4_weights ? "int4" : "bf16";
  j["lm_head"] = r.lm_head;
  j["kernel_isa"] = r.isa;
  j["bf16_dot_products"] = r.bf16_dot_products;
  j["int4_layout"] = r.int4_layout;
  j["precision"] = r.precision;
  j["threads"] = r.threads;
  j["decode_tokens"] = r.decode_tokens;
  j["prefill_chunk"] = r.prefill_chunk;
  j["repeat"] = r.repeat;
  j["kv_element_bytes"] = r.kv_element_bytes;
  j["kv_dtypes"] = r.kv_dtypes;
  j["bandwidth"] = {{"bytes_per_second", r.bandwidth.bytes_per_second},
                    {"buffer_bytes", r.bandwidth.buffer_bytes},
                    {"threads", r.bandwidth.threads},
                    {"passes", r.bandwidth.passes},
                    {"isa", r.bandwidth.isa}};
  if (r.paired_sweep_bytes > 0) j["paired_sweep_bytes"] = r.paired_sweep_bytes;
  j["rows"] = nlohmann::ordered_json::array();
  for (const BenchRow& row : r.rows) {
    nlohmann::ordered_json x;
    x["phase"] = row.phase;
    if (row.phase == "prefill") x["prompt_tokens"] = row.tokens;
    else x["streams"] = row.streams, x["depth"] = row.depth;
    x["kv_dtype"] = row.kv_dtype;
    x["tokens_per_second"] = row.tokens_per_second;
    x["runs"] = row.runs;
    x["weight_bytes_per_token"] = row.weight_bytes_per_token;
    x["kv_bytes_per_token"] = row.kv_bytes_per_token;
    x["bytes_per_second"] = row.bytes_per_second;
    x["bandwidth_fraction"] = row.bandwidth_fraction;
    if (!row.step_sweeps.empty()) {
      x["paired_sweep_bytes_per_second"] = row.paired_bandwidth;
      x["paired_bandwidth_fraction"] = row.paired_fraction;
      x["step_seconds"] = row.step_seconds;
      x["step_sweeps"] = row.step_sweeps;
    }
    j["rows"].push_back(std::move(x));
  }
  if (r.int8_error)
    j["int8_logit_error"] = {{"positions", r.int8_error->positions}, {"max_abs", r.int8_error->max_abs},
                             {"mean_abs", r.int8_error->mean_abs}, {"exact_spread", r.int8_error->exact_spread},
                             {"top1_agree", r.int8_error->top1_agree}, {"mean_kl", r.int8_error->mean_kl}};
  j["kv_logit_errors"] = nlohmann::ordered_json::array();
  for (const KvError& k : r.kv_errors)
    j["kv_logit_errors"].push_back({{"kv_dtype", k.dtype}, {"reference", k.reference},
                                    {"positions", k.error.positions}, {"max_abs", k.error.max_abs},
                                    {"mean_abs", k.error.mean_abs}, {"exact_spread", k.error.exact_spread},
                                    {"top1_agree", k.error.top1_agree}, {"mean_kl", k.error.mean_kl}});
  if (r.speculative) j["speculative"] = speculative_json(*r.speculative);
  j["notes"] = r.notes;
  return j;
}

void write_bench_json(const BenchReport& report, const std::filesystem::path& path) {
  std::ofstream out(path);
  out << bench_report_json(report).dump(2) << "\n";
  if (!out.flush()) throw Error(fmt::format("{}: cannot write the JSON report", path.string()));
}

}  // namespace qs
