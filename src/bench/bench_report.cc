// `bench`'s report as people read it (a markdown table and notes) and as JSON (bench.h).
#include <fmt/format.h>

#include <fstream>

#include "bench/bench.h"
#include "util/error.h"

namespace qs {

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
  if (r.lora) s += format_lora_bench(*r.lora);
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
  if (r.lora) j["lora"] = lora_bench_json(*r.lora);
  j["notes"] = r.notes;
  return j;
}

void write_bench_json(const BenchReport& report, const std::filesystem::path& path) {
  std::ofstream out(path);
  out << bench_report_json(report).dump(2) << "\n";
  if (!out.flush()) throw Error(fmt::format("{}: cannot write the JSON report", path.string()));
}

}  // namespace qs
