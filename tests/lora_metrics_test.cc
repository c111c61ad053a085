// The LoRA and cache-config families of /metrics (server/lora_metrics.h, server/vllm_cache_config.h):
// vllm:lora_requests_info's series and values, the per-adapter qatserve_lora_* families, and vllm:cache_config_info's
// labels held to vLLM 0.34.0's CacheConfig keys as tests/data/vllm_metrics.json records them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "server/lora_metrics.h"
#include "server/metrics.h"
#include "server/vllm_cache_config.h"

namespace {

using namespace qs;

std::vector<std::string> sample_lines(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    if (line.starts_with(name + "{") || line.starts_with(name + " ")) out.push_back(line);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

std::string info_line(const std::string& running, const std::string& waiting, const std::string& value,
                      int max_lora = 2) {
  return "vllm:lora_requests_info{max_lora=\"" + std::to_string(max_lora) + "\",waiting_lora_adapters=\"" + waiting +
         "\",running_lora_adapters=\"" + running + "\"} " + value;
}

TEST(LoraMetrics, AdapterListsAreTheNamesWithSequences) {
  const std::vector<LoraLoad> loads = {{"a", 1, 0, 3}, {"b", 0, 2, 2}, {"c", 2, 1, 5}, {"idle", 0, 0, 9}};
  EXPECT_EQ(lora_adapter_list(loads, true), "a,c");
  EXPECT_EQ(lora_adapter_list(loads, false), "b,c");
  EXPECT_EQ(lora_adapter_list({}, true), "");
}

// Each pair of sets is a series whose value is the last time it was current; the current one has the latest value.
TEST(LoraMetrics, RequestsInfoSeriesPerSetsWithTheirLastTime) {
  LoraRequestsInfo info;
  auto write = [&](const std::vector<LoraLoad>& loads, double t) {
    Exposition e;
    info.write(e, 2, loads, t);
    return e.text();
  };
  std::string text = write({}, 1765000000.5);
  EXPECT_NE(text.find("# HELP vllm:lora_requests_info Running stats on lora requests.\n"
                      "# TYPE vllm:lora_requests_info gauge\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(sample_lines(text, "vllm:lora_requests_info"),
            std::vector<std::string>{info_line("", "", "1765000000.5")});
  write({{"a", 1, 0, 1}}, 1765000001.25);
  write({{"a", 1, 0, 2}, {"b", 0, 1, 1}}, 1765000002.0);
  text = write({{"a", 2, 0, 3}, {"b", 0, 0, 1}}, 1765000003.0);  // a's count changed, not the sets: the same series
  EXPECT_EQ(sample_lines(text, "vllm:lora_requests_info"),
            (std::vector<std::string>{info_line("", "", "1765000000.5"), info_line("a", "", "1765000003"),
                                      info_line("a", "b", "1765000002")}));
}

TEST(LoraMetrics, RequestsInfoKeepsABoundedNumberOfSeries) {
  LoraRequestsInfo info;
  Exposition last;
  for (int i = 0; i < 40; ++i) {
    Exposition e;
    info.write(e, 4, {{"adapter-" + std::to_string(i), 1, 0, 1}}, 1000.0 + i);
    last = e;
  }
  const auto lines = sample_lines(last.text(), "vllm:lora_requests_info");
  ASSERT_EQ(lines.size(), LoraRequestsInfo::kMaxSeries);
  EXPECT_EQ(lines.front(), info_line("adapter-24", "", "1024", 4));  // the oldest ones dropped
  EXPECT_EQ(lines.back(), info_line("adapter-39", "", "1039", 4));
}

TEST(LoraMetrics, FamiliesOnlyWithLoraServing) {
  ServerMetrics m("gemma");
  GaugeValues g;
  g.ready = true;
  g.engine.lora_loads = {{"austen-a", 1, 2, 7}, {"austen-b", 0, 0, 1}};
  std::string text = m.exposition(g);
  EXPECT_EQ(text.find("lora"), std::string::npos) << "no LoRA serving, no LoRA families";
  g.max_loras = 3;
  text = m.exposition(g);
  EXPECT_EQ(sample_lines(text, "qatserve_lora_requests_total"),
            (std::vector<std::string>{"qatserve_lora_requests_total{lora_name=\"austen-a\"} 7",
                                      "qatserve_lora_requests_total{lora_name=\"austen-b\"} 1"}));
  EXPECT_EQ(sample_lines(text, "qatserve_lora_requests_running"),
            (std::vector<std::string>{"qatserve_lora_requests_running{lora_name=\"austen-a\"} 1",
                                      "qatserve_lora_requests_running{lora_name=\"austen-b\"} 0"}));
  EXPECT_EQ(sample_lines(text, "qatserve_lora_requests_waiting"),
            (std::vector<std::string>{"qatserve_lora_requests_waiting{lora_name=\"austen-a\"} 2",
                                      "qatserve_lora_requests_waiting{lora_name=\"austen-b\"} 0"}));
  const auto info = sample_lines(text, "vllm:lora_requests_info");
  ASSERT_EQ(info.size(), 1u) << text;
  EXPECT_TRUE(info[0].starts_with(
      "vllm:lora_requests_info{max_lora=\"3\",waiting_lora_adapters=\"austen-a\",running_lora_adapters=\"austen-a\"} "))
      << info[0];
  const double value = std::stod(info[0].substr(info[0].rfind(' ') + 1));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(value, now, 60);  // a Unix time in seconds, as vLLM's set_to_current_time
}

TEST(LoraMetrics, PythonFloatStr) {
  EXPECT_EQ(python_float_str(4), "4.0");
  EXPECT_EQ(python_float_str(12.5), "12.5");
  EXPECT_EQ(python_float_str(0.1), "0.1");
  EXPECT_EQ(python_float_str(1.0 / 3), "0.3333333333333333");
}

// vLLM 0.34.0's keys in vLLM's order (CacheConfig.metrics_info() then engine), qatserve's KV pool in those that
// apply, a default CacheConfig's values in the rest (tests/data/vllm_metrics.json: labels, label_defaults).
TEST(LoraMetrics, CacheConfigInfoHasVllmKeysAndThePoolsValues) {
  std::ifstream in(std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/data/vllm_metrics.json");
  ASSERT_TRUE(in);
  const nlohmann::json vllm = nlohmann::json::parse(in);
  const nlohmann::json* record = nullptr;
  for (const nlohmann::json& f : vllm["families"])
    if (f["name"] == "vllm:cache_config_info") record = &f;
  ASSERT_NE(record, nullptr);
  const auto keys = (*record)["labels"].get<std::vector<std::string>>();
  const auto defaults = (*record)["label_defaults"].get<std::map<std::string, std::string>>();

  KvCacheFacts kv;
  kv.block_size = 16;
  kv.blocks = 40;
  kv.tokens = 640;
  kv.max_model_len = 256;
  kv.kv_dtype = "bf16";
  const MetricLabels labels = vllm_cache_config_labels(kv);
  std::vector<std::string> names;
  std::map<std::string, std::string> values;
  for (const auto& [k, v] : labels) {
    names.push_back(k);
    values[k] = v;
  }
  EXPECT_EQ(names, keys);
  const std::map<std::string, std::string> filled = {
      {"block_size", "16"},         {"cache_dtype", "bfloat16"},          {"num_gpu_blocks", "40"},
      {"kv_cache_size_tokens", "640"}, {"kv_cache_max_concurrency", "2.5"}, {"effective_attention_block_size", "16"},
      {"hash_block_size", "16"},    {"cache_hit_alignment_tokens", "16"}};
  for (const auto& [k, v] : values) {
    auto it = filled.find(k);
    EXPECT_EQ(v, it != filled.end() ? it->second : defaults.at(k)) << k;
  }
  kv.kv_dtype = "int8";
  kv.kv_memory = 1 << 20;
  kv.kv_events = true;
  for (const auto& [k, v] : vllm_cache_config_labels(kv)) {
    if (k == "cache_dtype") EXPECT_EQ(v, "int8_per_token_head");
    if (k == "kv_cache_memory_bytes") EXPECT_EQ(v, "1048576");
    if (k == "prefix_caching_hash_algo") EXPECT_EQ(v, "sha256_cbor");
  }

  ServerMetrics m("gemma");
  GaugeValues g;
  EXPECT_EQ(m.exposition(g).find("vllm:cache_config_info"), std::string::npos) << "not before the engine is ready";
  g.ready = true;
  g.vllm_cache_config = labels;
  const auto lines = sample_lines(m.exposition(g), "vllm:cache_config_info");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(lines[0].starts_with("vllm:cache_config_info{block_size=\"16\",user_specified_block_size=\"False\","))
      << lines[0];
  EXPECT_TRUE(lines[0].ends_with(",engine=\"0\"} 1")) << lines[0];
}

}  // namespace
