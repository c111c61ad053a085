#include "bench/lora_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "model/lora_adapter.h"

namespace qs {

namespace {

using namespace bench_util;
using Adapters = std::vector<std::shared_ptr<const LoraAdapter>>;

// Runs `tokens` into `cache` in chunks under `lora` (nullptr: the base); seconds taken.
double timed_prefill(const Gemma4Model& model, std::span<const int32_t> tokens, KvCache& cache, int64_t chunk,
                     const LoraAdapter* lora) {
  const auto t0 = Clock::now();
  for (size_t s = 0; s < tokens.size(); s += chunk) {
    const size_t m = std::min<size_t>(chunk, tokens.size() - s);
    SequenceStep step{tokens.subspan(s, m), &cache, s + m == tokens.size() ? LogitsWanted::Last : LogitsWanted::None};
    step.lora = lora;
    model.forward_batch(std::span(&step, 1));
  }
  return seconds_since(t0);
}

LoraBenchRow prefill_row(const Gemma4Model& model, const BenchOptions& o, const Adapters& adapters, int64_t prompt) {
  LoraBenchRow row{.phase = "prefill", .tokens = prompt};
  for (int r = 0; r < o.repeat; ++r) {
    const std::vector<int32_t> ids = bench_tokens(model.config().text, prompt, r + 1);
    for (const LoraAdapter* lora : r % 2 ? std::array{adapters.front().get(), static_cast<const LoraAdapter*>(nullptr)}
                                          : std::array{static_cast<const LoraAdapter*>(nullptr), adapters.front().get()}) {
      KvCache cache = model.new_cache(prompt);
      const double seconds = timed_prefill(model, ids, cache, o.prefill_chunk, lora);
      (lora ? row.lora_runs : row.base_runs).push_back(double(prompt) / seconds);
    }
  }
  return row;
}

// `streams` copies of `base` decode o.decode_tokens steps, first on the base alone, then with the adapters in turn.
LoraBenchRow decode_row(const Gemma4Model& model, const BenchOptions& o, const Adapters& adapters,
                        const KvCache& base, int64_t streams) {
  LoraBenchRow row{.phase = "decode", .streams = streams, .depth = base.length()};
  std::vector<std::vector<int32_t>> ids;
  for (int64_t s = 0; s < streams; ++s) ids.push_back(bench_tokens(model.config().text, o.decode_tokens, 1000 + s));
  for (int r = 0; r < o.repeat; ++r)
    for (const bool with_lora : r % 2 ? std::array{true, false} : std::array{false, true}) {
      std::vector<KvCache> caches(streams, base);
      std::vector<SequenceStep> batch(streams);
      double seconds = 0;
      for (int64_t i = 0; i < o.decode_tokens; ++i) {
        for (int64_t s = 0; s < streams; ++s) {
          batch[s] = {std::span(ids[s]).subspan(i, 1), &caches[s], LogitsWanted::Last};
          batch[s].lora = with_lora ? adapters[s % adapters.size()].get() : nullptr;
        }
        const auto t0 = Clock::now();
        model.forward_batch(batch);
        seconds += seconds_since(t0);
      }
      (with_lora ? row.lora_runs : row.base_runs).push_back(double(streams * o.decode_tokens) / seconds);
    }
  return row;
}

}  // namespace

LoraBenchReport lora_bench(const Gemma4Model& model, const BenchOptions& o,
                           const std::function<void(const std::string&)>& log) {
  LoraBenchReport report;
  Adapters adapters;
  for (const auto& dir : o.loras) {
    adapters.push_back(LoraAdapter::load(dir, model, dir.filename().string()));
    report.adapters.push_back(dir.string());
    report.max_rank = std::max(report.max_rank, adapters.back()->max_rank());
    report.linears = std::max(report.linears, static_cast<int64_t>(adapters.back()->weights().size()));
    report.adapter_bytes += adapters.back()->bytes();
  }
  auto finish = [&](LoraBenchRow row, const std::string& what) {
    row.base_tokens_per_second = median(row.base_runs);
    row.lora_tokens_per_second = median(row.lora_runs);
    log(fmt::format("{}: base {:.2f} tokens/s, with adapters {:.2f} ({:.3f}x)", what, row.base_tokens_per_second,
                    row.lora_tokens_per_second, row.ratio()));
    report.rows.push_back(std::move(row));
  };
  for (int64_t p : o.prompts) finish(prefill_row(model, o, adapters, p), fmt::format("prefill {} tokens", p));
  const int64_t most = o.depths.empty() ? 0 : *std::max_element(o.depths.begin(), o.depths.end());
  for (int64_t depth : o.depths) {
    KvCache base = model.new_cache(most + o.decode_tokens);
    if (depth > 0) timed_prefill(model, bench_tokens(model.config().text, depth, 7), base, o.prefill_chunk, nullptr);
    for (int64_t n : o.streams)
      finish(decode_row(model, o, adapters, base, n), fmt::format("decode {} streams at depth {}", n, depth));
  }
  return report;
}

std::string format_lora_bench(const LoraBenchReport& r) {
  std::string s = fmt::format("LoRA adapters beside the base: {} adapter(s), rank up to {}, up to {} linears each, {:.1f} "
                              "MB held (A and B in f32); decode streams take the adapters in turn\n\n",
                              r.adapters.size(), r.max_rank, r.linears, double(r.adapter_bytes) / 1e6);
  s += "| phase | prompt / streams | depth | base tokens/s | with adapters tokens/s | ratio |\n";
  s += "| --- | --- | --- | --- | --- | --- |\n";
  for (const LoraBenchRow& row : r.rows)
    s += fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:.3f}x |\n", row.phase,
                     row.phase == "prefill" ? fmt::format("{} tokens", row.tokens)
                                            : fmt::format("{} stream{}", row.streams, row.streams == 1 ? "" : "s"),
                     row.depth, row.base_tokens_per_second, row.lora_tokens_per_second, row.ratio());
  return s + "\n";
}

nlohmann::ordered_json lora_bench_json(const LoraBenchReport& r) {
  nlohmann::ordered_json j = {{"adapters", r.adapters}, {"max_rank", r.max_rank}, {"linears", r.linears},
                              {"adapter_bytes", r.adapter_bytes}, {"rows", nlohmann::ordered_json::array()}};
  for (const LoraBenchRow& row : r.rows)
    j["rows"].push_back({{"phase", row.phase}, {"prompt_tokens", row.tokens}, {"streams", row.streams},
                         {"depth", row.depth}, {"base_tokens_per_second", row.base_tokens_per_second},
                         {"lora_tokens_per_second", row.lora_tokens_per_second}, {"ratio", row.ratio()},
                         {"base_runs", row.base_runs}, {"lora_runs", row.lora_runs}});
  return j;
}

}  // namespace qs
