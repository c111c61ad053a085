#pragma once
// The LoRA families of /metrics (with LoRA serving on: --lora or --enable-lora-runtime-loading), from the engine's
// per-adapter loads (engine/lora_loads.h):
//
//   vllm:lora_requests_info{max_lora,waiting_lora_adapters,running_lora_adapters}   gauge, as vLLM 0.34.0 writes it
//       (vllm/v1/metrics/loggers.py): max_lora = --max-loras; the adapters with a sequence running, and those with
//       one waiting, their names comma-joined (by name, no spaces; "" for none); the value is the Unix time in
//       seconds at which that pair of sets was last current. Each new pair of sets is a new series, and earlier ones
//       keep their last time, so the current one is the series with the latest value (what the Gateway API Inference
//       Extension's endpoint picker reads). At most kMaxSeries are kept: past them the least recent is dropped.
//       vLLM 0.34.0 lists in both labels every adapter with a request running or waiting (its LoRARequestStates
//       gives each one a running and a waiting count, 0 included, vllm/v1/metrics/stats.py); qatserve lists an
//       adapter under running only with a sequence running, under waiting only with one waiting.
//   qatserve_lora_requests_total{lora_name}       counter: sequences the engine accepted for the adapter
//   qatserve_lora_requests_running{lora_name}     gauge: its sequences in the running batch
//   qatserve_lora_requests_waiting{lora_name}     gauge: its sequences queued
// (the three per adapter that ever had a sequence).
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "engine/lora_loads.h"

namespace qs {

class Exposition;

class LoraRequestsInfo {
 public:
  static constexpr size_t kMaxSeries = 16;

  // Writes vllm:lora_requests_info: the series of `loads`' current sets at `unix_time`, the earlier ones at theirs.
  void write(Exposition& e, int max_lora, const std::vector<LoraLoad>& loads, double unix_time);

 private:
  struct Series {
    std::string running, waiting;
    double last = 0;  // when it was last current
  };
  std::mutex mutex_;
  std::vector<Series> series_;  // in the order first seen
};

// "a,b": the names of the loads with running (or else waiting) sequences, as vLLM joins them.
std::string lora_adapter_list(const std::vector<LoraLoad>& loads, bool running);

// The qatserve_lora_requests_{total,running,waiting} families.
void write_lora_load_families(Exposition& e, const std::vector<LoraLoad>& loads);

}  // namespace qs
