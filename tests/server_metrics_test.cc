// The Prometheus text exposition the server writes by hand: histogram buckets, value and label formatting, and a
// line-by-line check of the whole /metrics body against the format's grammar. The external check is the server
// test's: prometheus_client's parser reads a live /metrics (tests/server/server_metrics_checks.py). Every vllm: family
// is held to vLLM's own source, as recorded (version, file, line) in tests/data/vllm_metrics.json.
#include "server/metrics.h"
#include "server/vllm_cache_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

using namespace qs;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// name{labels} -> value for every sample line.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  for (const std::string& line : lines_of(text)) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    std::string v = line.substr(space + 1);
    out[line.substr(0, space)] = v == "+Inf" ? INFINITY : v == "-Inf" ? -INFINITY : std::stod(v);
  }
  return out;
}

TEST(ServerMetrics, HistogramBucketsAreCumulative) {
  Histogram h({1.0, 0.1, 10.0});  // sorted on construction
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0}) h.observe(v);
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.upper_bounds, (std::vector<double>{0.1, 1.0, 10.0}));
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 5}));  // le=0.1 counts 0.1 itself
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 55.65);
}

TEST(ServerMetrics, ValuesAndLabels) {
  EXPECT_EQ(Exposition::format_value(3), "3");
  EXPECT_EQ(Exposition::format_value(0.25), "0.25");
  EXPECT_EQ(Exposition::format_value(INFINITY), "+Inf");
  EXPECT_EQ(Exposition::format_value(-INFINITY), "-Inf");
  EXPECT_EQ(Exposition::format_value(std::nan("")), "NaN");
  EXPECT_EQ(Exposition::escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Exposition e;
  e.family("x_total", "counter", "Help with a \\ and\na newline.");
  e.sample("x_total", 2, {{"k", "v\"1"}, {"j", "2"}});
  EXPECT_EQ(e.text(), "# HELP x_total Help with a \\\\ and\\na newline.\n# TYPE x_total counter\n"
                      "x_total{k=\"v\\\"1\",j=\"2\"} 2\n");
  Exposition h;
  Histogram hist({0.5});
  hist.observe(0.25);
  h.histogram("lat_seconds", "Latency.", hist.snapshot());
  EXPECT_EQ(h.text(), "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
                      "lat_seconds_bucket{le=\"0.5\"} 1\nlat_seconds_bucket{le=\"+Inf\"} 1\n"
                      "lat_seconds_sum 0.25\nlat_seconds_count 1\n");
}

TEST(ServerMetrics, ExpositionFollowsTheTextFormat) {
  ServerMetrics m;
  m.sequence_finished("stop", 10, 5, 0.02, 0.01, 0.3);
  m.sequence_finished("length", 10, 8, 0.5, std::nullopt, 2.0);
  m.sequence_finished("abort", 7, 0, std::nullopt, std::nullopt, 0.1);
  m.request_rejected();
  GaugeValues g;
  g.ready = true;
  g.engine.running = 2;
  g.engine.waiting = 1;
  g.engine.kv_tokens_used = 100;
  g.engine.kv_tokens_total = 4096;
  g.engine.kv_bytes_used = 1000;
  g.engine.kv_bytes_total = 40960;
  g.engine.kv_blocks_used = 7;
  g.engine.kv_blocks_total = 256;
  g.engine.prefix_hit_tokens = 64;
  g.engine.steps = 321;
  g.engine.media_encodes = 5;
  g.engine.media_cache_hits = 6;
  g.resident_bytes = 123456789;
  g.weight_bytes = 987654321;
  g.http_connections = 2000;
  g.http_refused = 3;
  g.http_timeouts = 4;
  const std::string text = m.exposition(g);

  // Grammar: comments are HELP/TYPE, samples are `name{labels} value`; every sample's family was typed before it,
  // each family once; every name is qatserve_- or (vLLM's names) vllm:-prefixed.
  const std::regex sample_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  const std::regex type_re(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::map<std::string, std::string> types;
  for (const std::string& line : lines_of(text)) {
    std::smatch match;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, match, type_re)) {
      EXPECT_TRUE(types.emplace(match[1], match[2]).second) << "family typed twice: " << line;
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, match, sample_re)) << "not a sample line: '" << line << "'";
    std::string name = match[1];
    EXPECT_TRUE(name.rfind("qatserve_", 0) == 0 || name.rfind("vllm:", 0) == 0) << name;
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!types.count(family) && family.ends_with(suffix)) family = family.substr(0, family.size() - std::strlen(suffix));
    EXPECT_TRUE(types.count(family)) << "sample before its # TYPE: " << line;
  }
  EXPECT_EQ(types["qatserve_requests_total"], "counter");
  EXPECT_EQ(types["qatserve_time_to_first_token_seconds"], "histogram");
  EXPECT_EQ(types["qatserve_time_per_output_token_seconds"], "histogram");
  EXPECT_EQ(types["qatserve_e2e_request_latency_seconds"], "histogram");
  EXPECT_EQ(types["qatserve_requests_running"], "gauge");

  auto s = samples(text);
  EXPECT_EQ(s["qatserve_requests_total{outcome=\"stop\"}"], 1);
  EXPECT_EQ(s["qatserve_requests_total{outcome=\"length\"}"], 1);
  EXPECT_EQ(s["qatserve_requests_total{outcome=\"abort\"}"], 1);
  EXPECT_EQ(s["qatserve_requests_total{outcome=\"rejected\"}"], 1);
  EXPECT_TRUE(s.count("qatserve_requests_total{outcome=\"error\"}"));  // present at 0
  EXPECT_EQ(s["qatserve_prompt_tokens_total"], 27);
  EXPECT_EQ(s["qatserve_generation_tokens_total"], 13);
  EXPECT_EQ(s["qatserve_time_to_first_token_seconds_count"], 2);
  EXPECT_DOUBLE_EQ(s["qatserve_time_to_first_token_seconds_sum"], 0.52);
  EXPECT_EQ(s["qatserve_time_per_output_token_seconds_count"], 1);
  EXPECT_EQ(s["qatserve_e2e_request_latency_seconds_count"], 3);
  EXPECT_EQ(s["qatserve_e2e_request_latency_seconds_bucket{le=\"+Inf\"}"], 3);
  EXPECT_EQ(s["qatserve_e2e_request_latency_seconds_bucket{le=\"0.25\"}"], 1);
  EXPECT_EQ(s["qatserve_e2e_request_latency_seconds_bucket{le=\"0.5\"}"], 2);
  EXPECT_EQ(s["qatserve_requests_running"], 2);
  EXPECT_EQ(s["qatserve_requests_waiting"], 1);
  EXPECT_EQ(s["qatserve_kv_cache_used_tokens"], 100);
  EXPECT_EQ(s["qatserve_kv_cache_total_tokens"], 4096);
  EXPECT_EQ(s["qatserve_kv_cache_blocks_used"], 7);
  EXPECT_EQ(s["qatserve_kv_cache_blocks_total"], 256);
  EXPECT_EQ(s["qatserve_prefix_cache_hit_tokens_total"], 64);
  EXPECT_EQ(s["qatserve_engine_steps_total"], 321);
  EXPECT_EQ(s["qatserve_media_encode_total"], 5);
  EXPECT_EQ(s["qatserve_media_cache_hits_total"], 6);
  EXPECT_EQ(s["qatserve_resident_memory_bytes"], 123456789);
  EXPECT_EQ(s["qatserve_weight_bytes{device=\"cpu\"}"], 987654321);
  EXPECT_EQ(s["qatserve_ready"], 1);
  EXPECT_EQ(s["qatserve_http_connections"], 2000);
  EXPECT_EQ(s["qatserve_http_connections_refused_total"], 3);
  EXPECT_EQ(s["qatserve_http_timeouts_total"], 4);

  // Buckets never decrease.
  double previous = -1;
  for (const std::string& line : lines_of(text)) {
    if (line.rfind("qatserve_time_to_first_token_seconds_bucket", 0) != 0) continue;
    double v = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_GE(v, previous) << line;
    previous = v;
  }
}

// vLLM's names (vllm/v1/metrics/loggers.py) beside ours, from the same measurements: labels model_name and engine,
// counters with _total, KV usage a fraction of the blocks, inter-token gaps counted per token.
TEST(ServerMetrics, VllmNamesShareTheMeasurements) {
  ServerMetrics m("gemma-4-e2b");
  m.sequence_finished("stop", 10, 5, 0.02, 0.01, 0.3);
  m.sequence_finished("abort", 7, 0, std::nullopt, std::nullopt, 0.1);
  m.request_rejected();
  m.tokens_after_first(0.0, 0);   // the first token alone: no gap (its wait is the TTFT)
  m.tokens_after_first(0.03, 3);  // three tokens 30 ms after the previous one: three gaps of 10 ms
  GaugeValues g;
  g.ready = true;
  g.engine.running = 3;
  g.engine.waiting = 2;
  g.engine.kv_blocks_used = 64;
  g.engine.kv_blocks_total = 256;
  g.engine.prefix_hit_tokens = 48;
  g.engine.prefix_query_tokens = 80;
  g.engine.preemptions = 4;
  const std::string text = m.exposition(g);
  auto s = samples(text);
  const std::string l = "model_name=\"gemma-4-e2b\",engine=\"0\"";
  EXPECT_EQ(s["vllm:num_requests_running{" + l + "}"], 3);
  EXPECT_EQ(s["vllm:num_requests_waiting{" + l + "}"], 2);
  EXPECT_DOUBLE_EQ(s["vllm:kv_cache_usage_perc{" + l + "}"], 0.25);
  EXPECT_DOUBLE_EQ(s["vllm:gpu_cache_usage_perc{" + l + "}"], 0.25);
  EXPECT_EQ(s["vllm:gpu_prefix_cache_hits_total{" + l + "}"], 48);
  EXPECT_EQ(s["vllm:gpu_prefix_cache_queries_total{" + l + "}"], 80);
  EXPECT_EQ(s["vllm:prefix_cache_hits_total{" + l + "}"], 48);
  EXPECT_EQ(s["vllm:prefix_cache_queries_total{" + l + "}"], 80);
  EXPECT_EQ(s["qatserve_prefix_cache_query_tokens_total"], 80);
  EXPECT_EQ(s["vllm:num_preemptions_total{" + l + "}"], 4);
  EXPECT_EQ(s["vllm:prompt_tokens_total{" + l + "}"], s["qatserve_prompt_tokens_total"]);
  EXPECT_EQ(s["vllm:generation_tokens_total{" + l + "}"], 5);
  EXPECT_EQ(s["vllm:request_success_total{" + l + ",finished_reason=\"stop\"}"], 1);
  EXPECT_EQ(s["vllm:request_success_total{" + l + ",finished_reason=\"abort\"}"], 1);
  EXPECT_FALSE(s.count("vllm:request_success_total{" + l + ",finished_reason=\"rejected\"}"));
  EXPECT_EQ(s["vllm:time_to_first_token_seconds_count{" + l + "}"], s["qatserve_time_to_first_token_seconds_count"]);
  EXPECT_EQ(s["vllm:e2e_request_latency_seconds_count{" + l + "}"], 2);
  EXPECT_EQ(s["vllm:request_time_per_output_token_seconds_count{" + l + "}"], 1);
  EXPECT_EQ(s["qatserve_inter_token_latency_seconds_count"], 3);
  EXPECT_DOUBLE_EQ(s["qatserve_inter_token_latency_seconds_sum"], 0.03);
  EXPECT_EQ(s["qatserve_inter_token_latency_seconds_bucket{le=\"0.01\"}"], 3);
  EXPECT_EQ(s["vllm:inter_token_latency_seconds_count{" + l + "}"], 3);
  EXPECT_EQ(s["vllm:time_per_output_token_seconds_count{" + l + "}"], 3);
  EXPECT_EQ(s["vllm:inter_token_latency_seconds_bucket{" + l + ",le=\"+Inf\"}"], 3);
  EXPECT_NE(text.find("# TYPE vllm:request_success_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE vllm:kv_cache_usage_perc gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE vllm:e2e_request_latency_seconds histogram\n"), std::string::npos);

  g.engine.kv_blocks_total = 0;  // before the engine exists: no pool, no usage
  EXPECT_EQ(samples(m.exposition(g))["vllm:kv_cache_usage_perc{" + l + "}"], 0);
}

// One family of an exposition as a scraper sees it: TYPE, HELP (unescaped) and, per sample, its label names (a
// histogram's `le` left out) and values.
struct ScrapedFamily {
  std::string type, help;
  std::vector<std::map<std::string, std::string>> samples;
};

// The text format's escapes: \\ and \n (HELP), also \" (label values).
std::string unescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      char c = text[++i];
      out += c == 'n' ? '\n' : c;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Where a record of tests/data/vllm_metrics.json comes from: vLLM version, file and line.
std::string source_of(const nlohmann::json& family, const nlohmann::json& vllm) {
  const std::string version = family.contains("vllm_version") ? family["vllm_version"] : vllm["source"]["version"];
  return "vLLM " + version + " " + family.at("file").get<std::string>() + ":" +
         std::to_string(family.at("line").get<int>());
}

// name{k="v",...} value -> (name, labels), a failure on labels it cannot read.
std::pair<std::string, std::map<std::string, std::string>> parse_sample(const std::string& line) {
  std::map<std::string, std::string> labels;
  size_t brace = line.find('{'), end = line.rfind(' ');
  std::string name = line.substr(0, std::min(brace, end));
  if (brace == std::string::npos || brace > end) return {name, labels};
  size_t i = brace + 1;
  while (i < line.size() && line[i] != '}') {
    size_t eq = line.find("=\"", i);
    if (eq == std::string::npos) break;
    std::string key = line.substr(i, eq - i);
    size_t j = eq + 2;
    while (j < line.size() && line[j] != '"') j += line[j] == '\\' ? 2 : 1;
    EXPECT_TRUE(labels.emplace(key, unescape(std::string_view(line).substr(eq + 2, j - eq - 2))).second)
        << "label twice: " << line;
    i = j + 1;
    if (i < line.size() && line[i] == ',') ++i;
  }
  EXPECT_TRUE(i < line.size() && line[i] == '}') << "unparsed labels: " << line;
  return {name, labels};
}

std::map<std::string, ScrapedFamily> scrape(const std::string& text) {
  std::map<std::string, ScrapedFamily> families;
  for (const std::string& line : lines_of(text)) {
    if (line.rfind("# HELP ", 0) == 0) {
      size_t space = line.find(' ', 7);
      families[line.substr(7, space - 7)].help = unescape(std::string_view(line).substr(space + 1));
    } else if (line.rfind("# TYPE ", 0) == 0) {
      size_t space = line.find(' ', 7);
      families[line.substr(7, space - 7)].type = line.substr(space + 1);
    } else if (!line.empty() && line[0] != '#') {
      auto [name, labels] = parse_sample(line);
      std::string family = name;
      if (!families.count(family))
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          std::string base = name.substr(0, name.size() - std::min(name.size(), std::strlen(suffix)));
          if (name.ends_with(suffix) && families.count(base) && families[base].type == "histogram") {
            family = base;
            if (std::strcmp(suffix, "_bucket") == 0) {
              EXPECT_EQ(labels.erase("le"), 1u) << "bucket without le: " << line;
            }
          }
        }
      EXPECT_TRUE(families.count(family)) << "sample of no typed family: " << line;
      families[family].samples.push_back(std::move(labels));
    }
  }
  return families;
}

// Every vllm: family qatserve writes against vLLM's source (tests/data/vllm_metrics.json: vLLM 0.34.0's
// vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py, names as /metrics shows them, counters with _total):
// the name is one vLLM declares, with vLLM's type, label names and HELP text; finished_reason only vLLM's values. The
// names vLLM has since dropped but older routers and dashboards read (legacy_families) are held to the last release
// that exported them. The families qatserve writes are exactly those the file marks qatserve_emits.
TEST(ServerMetrics, VllmFamiliesMatchVllmSource) {
  std::ifstream in(std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/data/vllm_metrics.json");
  ASSERT_TRUE(in) << "tests/data/vllm_metrics.json";
  const nlohmann::json vllm = nlohmann::json::parse(in);
  ASSERT_EQ(vllm["source"]["version"], "0.34.0");
  std::map<std::string, const nlohmann::json*> known;  // exposed name -> its record
  std::set<std::string> marked;                        // qatserve_emits: true
  for (const char* list : {"families", "legacy_families"})
    for (const nlohmann::json& f : vllm.at(list)) {
      const std::string name = f.at("name");
      ASSERT_TRUE(name.starts_with("vllm:")) << name;
      ASSERT_TRUE(known.emplace(name, &f).second) << "listed twice: " << name;
      // prometheus_client's text format: a counter shows as its declared name + _total, the rest as declared.
      EXPECT_EQ(name, f.at("declared_as").get<std::string>() + (f.at("type") == "counter" ? "_total" : "")) << name;
      if (f.at("qatserve_emits").get<bool>()) marked.insert(name);
    }
  const nlohmann::json& reasons = vllm["label_values"]["finished_reason"]["values"];

  ServerMetrics m("gemma-4-e2b");  // every outcome, every histogram observed
  m.sequence_finished("stop", 10, 5, 0.02, 0.01, 0.3);
  m.sequence_finished("length", 10, 8, 0.5, 0.02, 2.0);
  m.sequence_finished("abort", 7, 0, std::nullopt, std::nullopt, 0.1);
  m.sequence_finished("error", 7, 1, 0.2, std::nullopt, 0.2);
  m.request_rejected();
  m.tokens_after_first(0.03, 3);
  GaugeValues g;
  g.ready = true;
  g.kv_dtype = "bf16";
  g.engine.running = 1;
  g.engine.kv_blocks_used = 3;
  g.engine.kv_blocks_total = 8;
  g.engine.spec_drafts = 2;
  g.engine.spec_draft_tokens = 6;
  g.engine.spec_accepted_tokens = 4;
  g.max_loras = 2;  // LoRA serving on: vllm:lora_requests_info
  g.engine.lora_loads = {{"adapter-a", 1, 1, 3}};
  g.vllm_cache_config = vllm_cache_config_labels({16, 8, 128, 64, "bf16"});
  std::set<std::string> written;
  for (const auto& [name, family] : scrape(m.exposition(g))) {
    if (!name.starts_with("vllm:")) continue;
    written.insert(name);
    auto it = known.find(name);
    if (it == known.end()) {
      ADD_FAILURE() << name << " is no family of vLLM " << vllm["source"]["version"].get<std::string>()
                    << " (tests/data/vllm_metrics.json)";
      continue;
    }
    const nlohmann::json& f = *it->second;
    const std::string where = source_of(f, vllm);
    EXPECT_EQ(family.type, f.at("type").get<std::string>()) << name << ", " << where;
    EXPECT_EQ(family.help, f.at("help").get<std::string>()) << name << ", " << where;
    ASSERT_TRUE(f.at("labels").is_array()) << name << ": labels not recorded, " << where;
    const auto vllm_labels = f.at("labels").get<std::set<std::string>>();
    EXPECT_FALSE(family.samples.empty()) << name;
    for (const auto& labels : family.samples) {
      std::set<std::string> names;
      for (const auto& [k, v] : labels) names.insert(k);
      EXPECT_EQ(names, vllm_labels) << name << ", " << where;
      if (labels.count("engine")) {
        EXPECT_EQ(labels.at("engine"), "0") << name;
      }
      if (labels.count("model_name")) {
        EXPECT_EQ(labels.at("model_name"), "gemma-4-e2b") << name;
      }
      if (labels.count("finished_reason")) {
        EXPECT_NE(std::find(reasons.begin(), reasons.end(), labels.at("finished_reason")), reasons.end())
            << name << ": finished_reason=" << labels.at("finished_reason") << " is not one of vLLM's";
      }
    }
  }
  EXPECT_EQ(written, marked) << "the vllm: families written differ from those tests/data/vllm_metrics.json marks "
                                "qatserve_emits";
}

TEST(ServerMetrics, ResidentMemory) {
  EXPECT_EQ(parse_vmrss_bytes("Name:\tqatserve\nVmPeak:\t  999 kB\nVmRSS:\t    1234 kB\nThreads: 3\n"), 1234u * 1024);
  EXPECT_EQ(parse_vmrss_bytes("Name:\tx\n"), 0u);
  EXPECT_GT(resident_memory_bytes(), 1u << 20);  // this test process
  EXPECT_EQ(resident_memory_bytes("/nonexistent/status"), 0u);
}

}  // namespace
