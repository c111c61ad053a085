#pragma once
// Server metrics in the Prometheus text exposition format (version 0.0.4), written by hand: Debian packages no
// Prometheus client. The `qatserve_` families below, then the same measurements again under the names and labels
// vLLM exports (vllm/v1/metrics/loggers.py), which LLM-aware routers and dashboards read (see the end).
//
//   qatserve_requests_total{outcome}                  counter: finished sequences by finish reason (stop, length,
//                                                      abort, error) and HTTP requests rejected before the engine
//                                                      ran them (rejected: bad parameters, queue full, ...)
//   qatserve_prompt_tokens_total                       counter: prompt tokens of sequences that finished
//   qatserve_generation_tokens_total                   counter: tokens generated
//   qatserve_time_to_first_token_seconds               histogram: request arrival -> first generated token
//   qatserve_time_per_output_token_seconds             histogram: mean gap between generated tokens, per sequence
//   qatserve_inter_token_latency_seconds               histogram: each gap between generated tokens (a batch of k
//                                                      tokens delivered together counts k gaps of a k-th each)
//   qatserve_e2e_request_latency_seconds               histogram: request arrival -> finish, per sequence
//   qatserve_requests_running / _waiting               gauges from the engine
//   qatserve_kv_cache_used_tokens / _total_tokens      gauges: KV positions held / the budget
//   qatserve_kv_cache_used_bytes / _total_bytes
//   qatserve_kv_cache_blocks_used / _total              gauges: KV pool blocks held by sequences / in the pool
//   qatserve_kv_cache_info{dtype}                      gauge: 1, labelled with the KV cache's dtype (--kv-dtype), once ready
//   qatserve_prefix_cache_hit_tokens_total             counter: prompt positions adopted from the prefix cache
//   qatserve_prefix_cache_query_tokens_total           counter: positions looked up there by admitted sequences
//   qatserve_preemptions_total                         counter: sequences sent back to recompute for KV blocks
//   qatserve_engine_steps_total                        counter: engine steps (one pass of the batch each)
//   qatserve_media_encode_total                        counter: images and clips sent through their tower
//   qatserve_media_cache_hits_total                    counter: images and clips whose soft tokens came from the
//                                                      media cache instead (--media-cache-mb)
//   qatserve_kv_events_batches_total{outcome}         counter: KV event batches published, and dropped because the
//                                                      publisher's queue was full (--kv-events-endpoint only)
//   qatserve_resident_memory_bytes                     gauge: VmRSS of this process
//   qatserve_planned_resident_bytes                    gauge: the memory plan's cpu resident figure for this
//                                                      server (weights but the row-read per-layer embedding table,
//                                                      runtime reserve, KV pool), to set VmRSS beside
//   qatserve_weight_bytes{device}                      gauge: model weights held per device
//   qatserve_ready                                     gauge: 1 once the model answered a warm-up request
//   qatserve_http_connections                          gauge: HTTP connections held (idle ones included)
//   qatserve_http_connections_refused_total            counter: connections refused past --max-connections
//   qatserve_http_timeouts_total                       counter: connections closed for a header or body not
//                                                      sent in time (--header-timeout, --body-timeout) or a
//                                                      response not read
//   qatserve_lora_requests_total / _running / _waiting {lora_name}   with LoRA serving on (lora_metrics.h)
//
// vLLM's names, each with labels model_name (the served model name) and engine="0", as vLLM writes them (names, types,
// labels and HELP as of vLLM 0.34.0, vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py, recorded in
// tests/data/vllm_metrics.json and checked by ctest ServerMetrics.VllmFamiliesMatchVllmSource):
//   vllm:num_requests_running, vllm:num_requests_waiting   gauges: = qatserve_requests_running / _waiting
//   vllm:kv_cache_usage_perc                              gauge: KV pool blocks held / blocks, a fraction in [0, 1]
//   vllm:prefix_cache_queries_total, _hits_total          counters: = the prefix-cache query / hit tokens
//   vllm:num_preemptions_total, vllm:prompt_tokens_total, vllm:generation_tokens_total   counters
//   vllm:request_success_total{finished_reason}           counter: = qatserve_requests_total but `rejected`
//   vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds                    histograms
//   vllm:inter_token_latency_seconds                      histogram: = qatserve_inter_token_latency_seconds, and
//   vllm:time_per_output_token_seconds                    its deprecated vLLM name, the same measurement
//   vllm:request_time_per_output_token_seconds            histogram: = qatserve_time_per_output_token_seconds
//   vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total   counters
//   vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_queries_total, vllm:gpu_prefix_cache_hits_total
//                                                         vLLM's deprecated names of kv_cache_usage_perc and the
//                                                         prefix-cache counters, exported by vLLM up to 0.10.2 and
//                                                         still read by some routers; like the deprecated
//                                                         time_per_output_token_seconds (vLLM up to 0.11.2), kept
//                                                         on purpose (tests/data/vllm_metrics.json, legacy_families)
//   vllm:lora_requests_info{max_lora,waiting_lora_adapters,running_lora_adapters}   gauge, with LoRA serving on:
//                                                         the Unix time each pair of adapter sets was last current
//                                                         (lora_metrics.h); no model_name or engine label, as vLLM
//   vllm:cache_config_info{block_size,...,engine}         gauge: 1, labelled with vLLM's CacheConfig keys filled
//                                                         with the KV pool's values (vllm_cache_config.h)
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine_stats.h"
#include "server/lora_metrics.h"

namespace qs {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value, uint64_t times = 1);  // `times` observations of `value`

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
  // A whole histogram family: _bucket{labels,le=...} lines, _sum and _count.
  void histogram(std::string_view name, std::string_view help, const Histogram::Snapshot& snapshot,
                 const MetricLabels& labels = {});
  const std::string& text() const { return text_; }

  static std::string format_value(double value);           // Go-style: +Inf, -Inf, NaN, shortest round trip
  static std::string escape_label(std::string_view value);  // backslash, quote and newline escaped

 private:
  std::string text_;
};

// Values read from the engine and the process when /metrics is scraped.
struct GaugeValues {
  bool ready = false;
  EngineStats engine;  // once ready
  uint64_t resident_bytes = 0, planned_resident_bytes = 0;
  std::string device = "cpu";
  std::string kv_dtype;  // once ready
  uint64_t weight_bytes = 0;
  int64_t http_connections = 0, http_refused = 0, http_timeouts = 0;  // http_transport.h
  struct KvEventBatches {
    uint64_t published = 0, dropped = 0;
  };
  std::optional<KvEventBatches> kv_events;  // with --kv-events-endpoint (kv_events_publisher.h)
  std::optional<int> max_loras;     // with LoRA serving on: --max-loras; the LoRA families then (lora_metrics.h)
  MetricLabels vllm_cache_config;  // once ready: vllm:cache_config_info's labels (vllm_cache_config.h)
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name = "");  // the model_name label of the vllm: families

  // One sequence finished. ttft: arrival to its first token (none when it produced none); tpot: mean seconds
  // between its tokens (none with fewer than two).
  void sequence_finished(std::string_view outcome, int64_t prompt_tokens, int64_t generated_tokens,
                         std::optional<double> ttft, std::optional<double> tpot, double latency);
  void request_rejected();
  // `tokens` tokens arrived together, `gap` seconds after the previous token of their sequence.
  void tokens_after_first(double gap, int64_t tokens);

  std::string exposition(const GaugeValues& gauges) const;

 private:
  void vllm_families(Exposition& e, const GaugeValues& g) const;  // called with mutex_ held

  const std::string model_name_;
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t, std::less<>> outcomes_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_, itl_, latency_;
  mutable LoraRequestsInfo lora_info_;
};

// VmRSS of /proc/self/status (or of the given status text) in bytes; 0 when absent.
uint64_t resident_memory_bytes(const std::filesystem::path& status = "/proc/self/status");
uint64_t parse_vmrss_bytes(std::string_view status_text);

}  // namespace qs
