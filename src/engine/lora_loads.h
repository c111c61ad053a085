#pragma once
// Per LoRA adapter: the engine's sequences running and waiting on it now, and those it has accepted since it
// started (EngineStats::lora_loads), for the server's vllm:lora_requests_info and qatserve_lora_* metrics.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

class LoraAdapter;

struct LoraLoad {
  std::string name;
  int running = 0, waiting = 0;  // sequences on the adapter now
  uint64_t requests = 0;         // sequences accepted for it (each choice of n counts)
  bool operator==(const LoraLoad&) const = default;
};

// The engine's record, kept under its lock: accepted() at submission, set_running() by the engine thread after
// admission and after each step, loads() when stats are read (the waiting queue counted then).
class LoraLoadBook {
 public:
  void accepted(const LoraAdapter* lora);  // null: the base model, not counted

  template <class Sequences>  // pointers to sequences with request.lora
  void set_running(const Sequences& running) {
    running_.clear();
    for (const auto& s : running)
      if (s->request.lora) ++running_[adapter_name(*s->request.lora)];
  }

  // Every adapter that ever had a sequence, by name.
  template <class Sequences>
  std::vector<LoraLoad> loads(const Sequences& waiting) const {
    std::map<std::string, int, std::less<>> waiting_counts;
    for (const auto& s : waiting)
      if (s->request.lora) ++waiting_counts[adapter_name(*s->request.lora)];
    return merge(waiting_counts);
  }

 private:
  static const std::string& adapter_name(const LoraAdapter& lora);
  std::vector<LoraLoad> merge(const std::map<std::string, int, std::less<>>& waiting) const;

  std::map<std::string, uint64_t, std::less<>> requests_;
  std::map<std::string, int, std::less<>> running_;
};

}  // namespace qs
