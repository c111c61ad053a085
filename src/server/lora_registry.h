#pragma once
// The LoRA adapters `serve` holds (docs/lora.md): those of --lora NAME=DIR, and those loaded or unloaded at run time
// by POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --enable-lora-runtime-loading). A request names one
// in its `model` field. Thread-safe: the prepare workers look adapters up while the I/O thread loads or unloads
// them; a request holds its adapter's shared_ptr, so one unloaded while it runs stays alive until it finishes.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace qs {

class Gemma4Model;
class LoraAdapter;

// vLLM's defaults (vllm/config/lora.py): one adapter, rank at most 16.
inline constexpr int kDefaultMaxLoras = 1;
inline constexpr int64_t kDefaultServeMaxLoraRank = 16;

struct ServedAdapter {
  std::string name;
  std::filesystem::path dir;  // as given: /v1/models lists it as the adapter's `root`
  std::shared_ptr<const LoraAdapter> adapter;
};

class LoraRegistry {
 public:
  // `base_name`: the served model's id, which no adapter may take.
  LoraRegistry(std::string base_name, int max_loras, int64_t max_rank);

  // Reads DIR against `base` and serves it as NAME. Throws ApiError 400 (vLLM's shape) naming the fault: an empty
  // name or path, a name taken (by the base or a loaded adapter), --max-loras reached, or what LoraAdapter::load
  // refuses (a missing or corrupt file, a rank over --max-lora-rank, a tensor that does not fit the base).
  void load(const std::string& name, const std::filesystem::path& dir, const Gemma4Model& base);
  // Throws ApiError 404 (vLLM's) when no adapter has that name.
  void unload(const std::string& name);

  // The adapter serving `name`, or null.
  std::shared_ptr<const LoraAdapter> find(const std::string& name) const;
  std::vector<ServedAdapter> list() const;  // in load order
  // The memory its adapters take in the serving plan: those loaded, plus, when adapters load at run time, each
  // free --max-loras slot at --max-lora-rank on every linear an adapter may target (engine/memory_plan.h).
  uint64_t planned_bytes(const Gemma4Model& base, bool runtime_loading) const;
  int max_loras() const { return max_loras_; }
  int64_t max_rank() const { return max_rank_; }

 private:
  void check_name_free(const std::string& name) const;  // with mutex_ held

  const std::string base_name_;
  const int max_loras_;
  const int64_t max_rank_;
  mutable std::mutex mutex_;
  std::vector<ServedAdapter> adapters_;
};

// --lora NAME=DIR: the name and the directory; throws qs::Error naming the flag when either is missing.
ServedAdapter parse_lora_module(const std::string& spec);

}  // namespace qs
