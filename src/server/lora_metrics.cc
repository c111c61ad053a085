#include "server/lora_metrics.h"

#include <algorithm>

#include "server/metrics.h"

namespace qs {

std::string lora_adapter_list(const std::vector<LoraLoad>& loads, bool running) {
  std::string out;
  for (const LoraLoad& l : loads) {
    if ((running ? l.running : l.waiting) == 0) continue;
    if (!out.empty()) out += ',';
    out += l.name;
  }
  return out;
}

void LoraRequestsInfo::write(Exposition& e, int max_lora, const std::vector<LoraLoad>& loads, double unix_time) {
  std::string running = lora_adapter_list(loads, true), waiting = lora_adapter_list(loads, false);
  std::lock_guard lock(mutex_);
  auto it = std::find_if(series_.begin(), series_.end(),
                         [&](const Series& s) { return s.running == running && s.waiting == waiting; });
  if (it != series_.end()) {
    it->last = std::max(it->last, unix_time);
  } else {
    series_.push_back({std::move(running), std::move(waiting), unix_time});
    if (series_.size() > kMaxSeries)
      series_.erase(std::min_element(series_.begin(), series_.end(),
                                     [](const Series& a, const Series& b) { return a.last < b.last; }));
  }
  e.family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
  const std::string max = std::to_string(max_lora);
  for (const Series& s : series_)
    e.sample("vllm:lora_requests_info", s.last,
             {{"max_lora", max}, {"waiting_lora_adapters", s.waiting}, {"running_lora_adapters", s.running}});
}

void write_lora_load_families(Exposition& e, const std::vector<LoraLoad>& loads) {
  e.family("qatserve_lora_requests_total", "counter", "Sequences the engine accepted, per LoRA adapter.");
  for (const LoraLoad& l : loads)
    e.sample("qatserve_lora_requests_total", static_cast<double>(l.requests), {{"lora_name", l.name}});
  e.family("qatserve_lora_requests_running", "gauge", "Sequences in the running batch, per LoRA adapter.");
  for (const LoraLoad& l : loads) e.sample("qatserve_lora_requests_running", l.running, {{"lora_name", l.name}});
  e.family("qatserve_lora_requests_waiting", "gauge", "Sequences queued for the running batch, per LoRA adapter.");
  for (const LoraLoad& l : loads) e.sample("qatserve_lora_requests_waiting", l.waiting, {{"lora_name", l.name}});
}

}  // namespace qs
