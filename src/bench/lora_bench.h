#pragma once
// `bench --lora DIR`: prefill and decoding with LoRA adapters beside the same rows on the base alone, on the same
// weights and caches, the two in turn within each repeat and which goes first alternating (base, adapters, adapters,
// base, ...), so that drift in the host's load reaches both alike. Decode rows give the streams the adapters in turn
// (stream s runs adapter s mod n), so one step adds several adapters' low-rank products, as serving several adapters
// does.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gemma4.h"

namespace qs {

struct BenchOptions;

struct LoraBenchRow {
  std::string phase;  // "prefill" or "decode"
  int64_t tokens = 0, streams = 0, depth = 0;
  std::vector<double> base_runs, lora_runs;  // tokens/s of each repeat
  double base_tokens_per_second = 0, lora_tokens_per_second = 0;  // medians
  double ratio() const { return base_tokens_per_second > 0 ? lora_tokens_per_second / base_tokens_per_second : 0; }
};

struct LoraBenchReport {
  std::vector<std::string> adapters;  // directories, in the order streams take them
  int64_t max_rank = 0, linears = 0;  // over the adapters: the largest rank, the most linears one adapts
  uint64_t adapter_bytes = 0;         // A and B of every adapter, as held
  std::vector<LoraBenchRow> rows;
};

LoraBenchReport lora_bench(const Gemma4Model& model, const BenchOptions& o,
                           const std::function<void(const std::string&)>& log);
std::string format_lora_bench(const LoraBenchReport& report);
nlohmann::ordered_json lora_bench_json(const LoraBenchReport& report);

}  // namespace qs
