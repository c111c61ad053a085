#pragma once
// Server metrics in the Prometheus text exposition format (version 0.0.4), written by hand: Debian packages no
// Prometheus client. Every name starts with `qatserve_`.
//
//   qatserve_requests_total{outcome}                  counter: finished sequences by finish reason (stop, length,
//                                                      abort, error) and HTTP requests rejected before the engine
//                                                      ran them (rejected: bad parameters, queue full, ...)
//   qatserve_prompt_tokens_total                       counter: prompt tokens of sequences that finished
//   qatserve_generation_tokens_total                   counter: tokens generated
//   qatserve_time_to_first_token_seconds               histogram: request arrival -> first generated token
//   qatserve_time_per_output_token_seconds             histogram: mean gap between generated tokens, per sequence
//   qatserve_e2e_request_latency_seconds               histogram: request arrival -> finish, per sequence
//   qatserve_requests_running / _waiting               gauges from the engine
//   qatserve_kv_cache_used_tokens / _total_tokens      gauges: KV positions held / the budget
//   qatserve_kv_cache_used_bytes / _total_bytes
//   qatserve_kv_cache_blocks_used / _total              gauges: KV pool blocks held by sequences / in the pool
//   qatserve_prefix_cache_hit_tokens_total             counter: prompt positions adopted from the prefix cache
//   qatserve_preemptions_total                         counter: sequences sent back to recompute for KV blocks
//   qatserve_engine_steps_total                        counter: engine steps (one pass of the batch each)
//   qatserve_resident_memory_bytes                     gauge: VmRSS of this process
//   qatserve_planned_resident_bytes                    gauge: the memory plan's cpu resident figure for this
//                                                      server (weights but the row-read per-layer embedding table,
//                                                      runtime reserve, KV pool), to set VmRSS beside
//   qatserve_weight_bytes{device}                      gauge: model weights held per device
//   qatserve_ready                                     gauge: 1 once the model answered a warm-up request
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qs {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Builds one exposition: a family header (# HELP, # TYPE) then its samples.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, double value, const MetricLabels& labels = {});
  // A whole histogram family: _bucket{le=...} lines, _sum and _count.
  void histogram(std::string_view name, std::string_view help, const Histogram::Snapshot& snapshot);
  const std::string& text() const { return text_; }

  static std::string format_value(double value);           // Go-style: +Inf, -Inf, NaN, shortest round trip
  static std::string escape_label(std::string_view value);  // backslash, quote and newline escaped

 private:
  std::string text_;
};

// Values read from the engine and the process when /metrics is scraped.
struct GaugeValues {
  bool ready = false;
  int running = 0, waiting = 0;
  int64_t kv_tokens_used = 0, kv_tokens_total = 0;
  uint64_t kv_bytes_used = 0, kv_bytes_total = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t prefix_cache_hit_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t engine_steps = 0;
  uint64_t resident_bytes = 0, planned_resident_bytes = 0;
  std::string device = "cpu";
  uint64_t weight_bytes = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One sequence finished. ttft: arrival to its first token (none when it produced none); tpot: mean seconds
  // between its tokens (none with fewer than two).
  void sequence_finished(std::string_view outcome, int64_t prompt_tokens, int64_t generated_tokens,
                         std::optional<double> ttft, std::optional<double> tpot, double latency);
  void request_rejected();

  std::string exposition(const GaugeValues& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t, std::less<>> outcomes_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_, latency_;
};

// VmRSS of /proc/self/status (or of the given status text) in bytes; 0 when absent.
uint64_t resident_memory_bytes(const std::filesystem::path& status = "/proc/self/status");
uint64_t parse_vmrss_bytes(std::string_view status_text);

}  // namespace qs
