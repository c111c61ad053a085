#include "server/lora_registry.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/memory_plan.h"
#include "model/gemma4.h"
#include "model/lora_adapter.h"
#include "server/openai_protocol.h"
#include "util/error.h"

namespace qs {

LoraRegistry::LoraRegistry(std::string base_name, int max_loras, int64_t max_rank)
    : base_name_(std::move(base_name)), max_loras_(max_loras), max_rank_(max_rank) {}

uint64_t LoraRegistry::planned_bytes(const Gemma4Model& base, bool runtime_loading) const {
  std::lock_guard lock(mutex_);
  uint64_t bytes = 0;
  for (const ServedAdapter& a : adapters_) bytes += a.adapter->bytes();
  const int free_slots = std::max(0, max_loras_ - static_cast<int>(adapters_.size()));
  if (runtime_loading) bytes += uint64_t(free_slots) * lora_adapter_bytes(base.config(), max_rank_);
  return bytes;
}

void LoraRegistry::check_name_free(const std::string& name) const {
  if (name == base_name_)
    throw ApiError(400, fmt::format("The lora adapter name '{}' is the base model's name.", name), "lora_name",
                   "InvalidUserInput");
  const bool taken = std::any_of(adapters_.begin(), adapters_.end(), [&](const ServedAdapter& a) { return a.name == name; });
  if (taken)
    throw ApiError(400, fmt::format("The lora adapter '{}' has already been loaded.", name), "lora_name",
                   "InvalidUserInput");
  if (static_cast<int>(adapters_.size()) >= max_loras_)
    throw ApiError(400, fmt::format("cannot load lora adapter '{}': {} adapters are loaded already, the most "
                                    "--max-loras allows; unload one first",
                                    name, adapters_.size()),
                   "lora_name", "BadRequestError");
}

void LoraRegistry::load(const std::string& name, const std::filesystem::path& dir, const Gemma4Model& base) {
  if (name.empty() || dir.empty())
    throw ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", "", "InvalidUserInput");
  {
    std::lock_guard lock(mutex_);
    check_name_free(name);  // before reading the files: a refusal costs nothing
  }
  std::shared_ptr<const LoraAdapter> adapter;
  try {
    adapter = LoraAdapter::load(dir, base, name, max_rank_);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("cannot load lora adapter '{}' from {}: {}", name, dir.string(), e.what()),
                   "lora_path", "BadRequestError");
  }
  std::lock_guard lock(mutex_);
  check_name_free(name);  // again: another load may have taken the name or the last slot meanwhile
  adapters_.push_back({name, dir, std::move(adapter)});
}

void LoraRegistry::unload(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const ServedAdapter& a) { return a.name == name; });
  if (it == adapters_.end())
    throw ApiError(404, fmt::format("The lora adapter '{}' cannot be found.", name), "lora_name", "NotFoundError");
  adapters_.erase(it);
}

std::shared_ptr<const LoraAdapter> LoraRegistry::find(const std::string& name) const {
  std::lock_guard lock(mutex_);
  for (const ServedAdapter& a : adapters_)
    if (a.name == name) return a.adapter;
  return nullptr;
}

std::vector<ServedAdapter> LoraRegistry::list() const {
  std::lock_guard lock(mutex_);
  return adapters_;
}

ServedAdapter parse_lora_module(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw Error(fmt::format("--lora {}: expected NAME=DIR (the model name requests give, and the PEFT adapter's "
                            "directory)", spec));
  return {spec.substr(0, eq), spec.substr(eq + 1), nullptr};
}

}  // namespace qs
