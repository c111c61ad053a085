#include "engine/lora_loads.h"

#include "model/lora_adapter.h"

namespace qs {

void LoraLoadBook::accepted(const LoraAdapter* lora) {
  if (lora) ++requests_[lora->name()];
}

const std::string& LoraLoadBook::adapter_name(const LoraAdapter& lora) { return lora.name(); }

std::vector<LoraLoad> LoraLoadBook::merge(const std::map<std::string, int, std::less<>>& waiting) const {
  std::map<std::string, LoraLoad, std::less<>> by_name;
  auto entry = [&](const std::string& name) -> LoraLoad& {
    LoraLoad& l = by_name[name];
    l.name = name;
    return l;
  };
  for (const auto& [name, n] : requests_) entry(name).requests = n;
  for (const auto& [name, n] : running_) entry(name).running = n;
  for (const auto& [name, n] : waiting) entry(name).waiting = n;
  std::vector<LoraLoad> out;
  out.reserve(by_name.size());
  for (auto& [name, l] : by_name) out.push_back(std::move(l));
  return out;
}

}  // namespace qs
