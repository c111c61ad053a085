#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

namespace qs {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double value, uint64_t times) {
  // Bucket i counts values <= bounds_[i] (Prometheus `le`), the last one everything above.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard lock(mutex_);
  counts_[i] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s;
  s.upper_bounds = bounds_;
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::string Exposition::format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return fmt::format("{}", static_cast<int64_t>(value));
  return fmt::format("{}", value);
}

std::string Exposition::escape_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  std::string escaped_help;
  for (char c : help) {
    if (c == '\\') escaped_help += "\\\\";
    else if (c == '\n') escaped_help += "\\n";
    else escaped_help += c;
  }
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped_help, name, type);
}

void Exposition::sample(std::string_view name, double value, const MetricLabels& labels) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) text_ += ',';
      text_ += fmt::format("{}=\"{}\"", labels[i].first, escape_label(labels[i].second));
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += format_value(value);
  text_ += '\n';
}

void Exposition::histogram(std::string_view name, std::string_view help, const Histogram::Snapshot& s,
                           const MetricLabels& labels) {
  family(name, "histogram", help);
  const std::string bucket = fmt::format("{}_bucket", name);
  auto with_le = [&](std::string le) {
    MetricLabels l = labels;
    l.emplace_back("le", std::move(le));
    return l;
  };
  for (size_t i = 0; i < s.upper_bounds.size(); ++i)
    sample(bucket, static_cast<double>(s.cumulative[i]), with_le(format_value(s.upper_bounds[i])));
  sample(bucket, static_cast<double>(s.count), with_le("+Inf"));
  sample(fmt::format("{}_sum", name), s.sum, labels);
  sample(fmt::format("{}_count", name), static_cast<double>(s.count), labels);
}

namespace {
const char* const kOutcomes[] = {"stop", "length", "abort", "error", "rejected"};
}

ServerMetrics::ServerMetrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40,
             80}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
             0.75, 1, 2.5}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
            0.75, 1, 2.5}),
      latency_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960}) {
  for (const char* o : kOutcomes) outcomes_[o] = 0;
}

void ServerMetrics::sequence_finished(std::string_view outcome, int64_t prompt_tokens, int64_t generated_tokens,
                                      std::optional<double> ttft, std::optional<double> tpot, double latency) {
  {
    std::lock_guard lock(mutex_);
    auto it = outcomes_.find(outcome);
    if (it == outcomes_.end()) it = outcomes_.emplace(std::string(outcome), 0).first;
    ++it->second;
    prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(prompt_tokens, 0));
    generated_tokens_ += static_cast<uint64_t>(std::max<int64_t>(generated_tokens, 0));
  }
  if (ttft) ttft_.observe(*ttft);
  if (tpot) tpot_.observe(*tpot);
  latency_.observe(latency);
}

void ServerMetrics::request_rejected() {
  std::lock_guard lock(mutex_);
  ++outcomes_["rejected"];
}

void ServerMetrics::tokens_after_first(double gap, int64_t tokens) {
  if (tokens > 0) itl_.observe(gap / static_cast<double>(tokens), static_cast<uint64_t>(tokens));
}

std::string ServerMetrics::exposition(const GaugeValues& g) const {
  Exposition e;
  std::lock_guard lock(mutex_);  // the counters; each histogram snapshot takes its own lock
  auto gauge = [&](const char* name, const char* help, double value, const MetricLabels& labels = {}) {
    e.family(name, "gauge", help);
    e.sample(name, value, labels);
  };
  auto counter = [&](const char* name, const char* help, auto value) {
    e.family(name, "counter", help);
    e.sample(name, static_cast<double>(value));
  };
  e.family("qatserve_requests_total", "counter",
           "Finished sequences by finish reason; HTTP requests rejected before generation (outcome=rejected).");
  for (const auto& [outcome, n] : outcomes_)
    e.sample("qatserve_requests_total", static_cast<double>(n), {{"outcome", outcome}});
  counter("qatserve_prompt_tokens_total", "Prompt tokens of finished sequences.", prompt_tokens_);
  counter("qatserve_generation_tokens_total", "Generated tokens.", generated_tokens_);
  e.histogram("qatserve_time_to_first_token_seconds", "Request arrival to the first generated token.",
              ttft_.snapshot());
  e.histogram("qatserve_time_per_output_token_seconds", "Mean time between generated tokens of a sequence.",
              tpot_.snapshot());
  e.histogram("qatserve_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.",
              itl_.snapshot());
  e.histogram("qatserve_e2e_request_latency_seconds", "Request arrival to the end of a sequence.", latency_.snapshot());
  gauge("qatserve_ready", "1 once the model has loaded and answered a warm-up request.", g.ready ? 1 : 0);
  gauge("qatserve_requests_running", "Sequences in the running batch.", g.engine.running);
  gauge("qatserve_requests_waiting", "Sequences queued for the running batch.", g.engine.waiting);
  gauge("qatserve_kv_cache_used_tokens", "KV cache positions held.", static_cast<double>(g.engine.kv_tokens_used));
  gauge("qatserve_kv_cache_total_tokens", "KV cache positions budgeted.", static_cast<double>(g.engine.kv_tokens_total));
  gauge("qatserve_kv_cache_used_bytes", "KV cache bytes held.", static_cast<double>(g.engine.kv_bytes_used));
  gauge("qatserve_kv_cache_total_bytes", "KV cache bytes budgeted.", static_cast<double>(g.engine.kv_bytes_total));
  gauge("qatserve_kv_cache_blocks_used", "KV pool blocks held by sequences.", static_cast<double>(g.engine.kv_blocks_used));
  gauge("qatserve_kv_cache_blocks_total", "KV pool blocks.", static_cast<double>(g.engine.kv_blocks_total));
  if (!g.kv_dtype.empty())
    gauge("qatserve_kv_cache_info", "1, labelled with how the KV cache stores K and V (f32, bf16 or int8).", 1,
          {{"dtype", g.kv_dtype}});
  counter("qatserve_prefix_cache_hit_tokens_total",
          "Prompt positions adopted from the prefix cache instead of computed.", g.engine.prefix_hit_tokens);
  counter("qatserve_prefix_cache_query_tokens_total", "Positions looked up in the prefix cache by admitted sequences.",
          g.engine.prefix_query_tokens);
  e.family("qatserve_prefix_cache_tier_hit_tokens_total", "counter",
           "Prompt positions adopted from the prefix cache, by the tier their blocks came from (ram, or disk: read "
           "back from --prefix-cache-dir).");
  const int64_t disk_hits = g.engine.prefix_disk_hit_tokens;
  e.sample("qatserve_prefix_cache_tier_hit_tokens_total", static_cast<double>(g.engine.prefix_hit_tokens - disk_hits),
           {{"tier", "ram"}});
  e.sample("qatserve_prefix_cache_tier_hit_tokens_total", static_cast<double>(disk_hits), {{"tier", "disk"}});
  if (g.engine.prefix_disk) {
    const DiskTierStats& d = g.engine.prefix_disk_stats;
    counter("qatserve_prefix_cache_disk_stored_blocks_total", "Blocks written to the prefix cache's disk tier.",
            d.stored);
    counter("qatserve_prefix_cache_disk_loaded_blocks_total", "Blocks read back from the prefix cache's disk tier.",
            d.loaded);
    counter("qatserve_prefix_cache_disk_rejected_files_total",
            "Disk-tier files found corrupt, truncated or foreign: not used, removed.", d.rejected);
    counter("qatserve_prefix_cache_disk_write_errors_total",
            "Blocks the disk tier could not write (a full disk, a block over the bound): serving went on.",
            d.write_errors);
    gauge("qatserve_prefix_cache_disk_bytes", "Bytes of the prefix cache's disk tier files.", static_cast<double>(d.bytes));
    gauge("qatserve_prefix_cache_disk_blocks", "Files (blocks of one layer class) in the disk tier.",
          static_cast<double>(d.files));
  }
  if (g.kv_events) {
    e.family("qatserve_kv_events_batches_total", "counter",
             "KV event batches published on --kv-events-endpoint, and dropped because the publisher's queue was full.");
    e.sample("qatserve_kv_events_batches_total", static_cast<double>(g.kv_events->published), {{"outcome", "published"}});
    e.sample("qatserve_kv_events_batches_total", static_cast<double>(g.kv_events->dropped), {{"outcome", "dropped"}});
  }
  counter("qatserve_preemptions_total", "Sequences sent back to recompute for want of KV blocks.", g.engine.preemptions);
  counter("qatserve_engine_steps_total", "Engine steps: one pass of the running batch through the model each.",
          g.engine.steps);
  counter("qatserve_media_encode_total", "Images and audio clips sent through their tower.", g.engine.media_encodes);
  counter("qatserve_media_cache_hits_total",
          "Images and audio clips whose soft tokens came from the media cache instead of their tower.",
          g.engine.media_cache_hits);
  counter("qatserve_spec_decode_drafts_total",
          "Speculative decoding: steps that verified a draft of at least one token.", g.engine.spec_drafts);
  counter("qatserve_spec_decode_draft_tokens_total", "Speculative decoding: draft tokens verified.",
          g.engine.spec_draft_tokens);
  counter("qatserve_spec_decode_accepted_tokens_total",
          "Speculative decoding: draft tokens accepted (the target picked the same token).", g.engine.spec_accepted_tokens);
  gauge("qatserve_spec_decode_acceptance_rate", "Accepted draft tokens / draft tokens since the start (0 before any).",
        g.engine.spec_draft_tokens ? static_cast<double>(g.engine.spec_accepted_tokens) / static_cast<double>(g.engine.spec_draft_tokens)
                            : 0.0);
  gauge("qatserve_resident_memory_bytes", "Resident set size of the server process (VmRSS).",
        static_cast<double>(g.resident_bytes));
  gauge("qatserve_planned_resident_bytes",
        "The memory plan's resident bytes for this server: weights but the row-read per-layer embedding table, "
        "runtime reserve, KV pool.",
        static_cast<double>(g.planned_resident_bytes));
  gauge("qatserve_weight_bytes", "Model weight bytes held per device.", static_cast<double>(g.weight_bytes),
        {{"device", g.device}});
  gauge("qatserve_http_connections", "HTTP connections held, idle ones included.",
        static_cast<double>(g.http_connections));
  counter("qatserve_http_connections_refused_total", "HTTP connections refused past --max-connections.",
          g.http_refused);
  counter("qatserve_http_timeouts_total",
          "HTTP connections closed for a request header or body not sent in time, or a response not read.",
          g.http_timeouts);
  if (g.max_loras) write_lora_load_families(e, g.engine.lora_loads);
  vllm_families(e, g);
  return e.text();
}

// The measurements above again, as vLLM names and labels them (its counters are declared without `_total`, which
// prometheus_client appends to the sample and the family in this text format). Names, types, labels and HELP as vLLM
// 0.34.0 writes them (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py); the four legacy names as the last
// release that exported them did. Recorded with file and line in tests/data/vllm_metrics.json and checked against
// this exposition by ctest ServerMetrics.VllmFamiliesMatchVllmSource.
void ServerMetrics::vllm_families(Exposition& e, const GaugeValues& g) const {
  const MetricLabels labels = {{"model_name", model_name_}, {"engine", "0"}};
  auto one = [&](const char* name, const char* type, const char* help, double value) {
    e.family(name, type, help);
    e.sample(name, value, labels);
  };
  one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", g.engine.running);
  one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", g.engine.waiting);
  const double kv_usage =
      g.engine.kv_blocks_total > 0 ? static_cast<double>(g.engine.kv_blocks_used) / static_cast<double>(g.engine.kv_blocks_total) : 0.0;
  one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_usage);
  one("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
      static_cast<double>(g.engine.prefix_query_tokens));
  one("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
      static_cast<double>(g.engine.prefix_hit_tokens));
  // vLLM's pre-0.9 names, deprecated in 0.9, exported by default up to vLLM 0.10.2 (hidden in 0.11, gone from 0.12)
  // and still the ones the production-stack router's scraper and older Gateway API Inference Extension endpoint
  // pickers read. HELP as vLLM 0.10.2 wrote it, missing spaces included (its adjacent string literals).
  one("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
      "vllm:kv_cache_usage_perc instead.", kv_usage);
  one("vllm:gpu_prefix_cache_queries_total", "counter", "GPU prefix cache queries, in terms of number of queried"
      "tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.", static_cast<double>(g.engine.prefix_query_tokens));
  one("vllm:gpu_prefix_cache_hits_total", "counter", "GPU prefix cache hits, in terms of number of cached tokens. "
      "DEPRECATED: Use vllm:prefix_cache_hits instead.", static_cast<double>(g.engine.prefix_hit_tokens));
  one("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
      static_cast<double>(g.engine.preemptions));
  one("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
      static_cast<double>(g.engine.spec_drafts));
  one("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
      static_cast<double>(g.engine.spec_draft_tokens));
  one("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
      static_cast<double>(g.engine.spec_accepted_tokens));
  one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", static_cast<double>(prompt_tokens_));
  one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
      static_cast<double>(generated_tokens_));
  e.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [outcome, n] : outcomes_) {
    if (outcome == "rejected") continue;  // never reached the engine: vLLM counts finished requests only
    MetricLabels l = labels;
    l.emplace_back("finished_reason", outcome);
    e.sample("vllm:request_success_total", static_cast<double>(n), l);
  }
  e.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_.snapshot(),
              labels);
  const Histogram::Snapshot itl = itl_.snapshot();
  e.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl, labels);
  // Its name before vLLM 0.11 (the same observations; exported by default up to 0.11.2, hidden in 0.12 and 0.13,
  // absent from 0.34), which older dashboards plot; HELP as 0.11.2 wrote it.
  e.histogram("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds "
              "instead.", itl, labels);
  e.histogram("vllm:request_time_per_output_token_seconds",
              "Histogram of time_per_output_token_seconds per request.", tpot_.snapshot(), labels);
  e.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              latency_.snapshot(), labels);
  if (g.max_loras) {
    const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    lora_info_.write(e, *g.max_loras, g.engine.lora_loads, now);
  }
  if (!g.vllm_cache_config.empty()) {
    e.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    e.sample("vllm:cache_config_info", 1, g.vllm_cache_config);
  }
}

uint64_t parse_vmrss_bytes(std::string_view status_text) {
  size_t pos = 0;
  while (pos < status_text.size()) {
    size_t end = status_text.find('\n', pos);
    std::string_view line = status_text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    if (line.starts_with("VmRSS:")) {
      line.remove_prefix(6);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      uint64_t kb = 0;
      auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), kb);
      if (ec != std::errc()) return 0;
      return kb * 1024;  // the kernel writes "kB" and means KiB
    }
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return 0;
}

uint64_t resident_memory_bytes(const std::filesystem::path& status) {
  std::ifstream f(status);
  if (!f) return 0;
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_vmrss_bytes(ss.str());
}

}  // namespace qs
