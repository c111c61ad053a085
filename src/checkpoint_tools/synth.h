#pragma once
// `qatserve synth`: synthetic checkpoints of the real Gemma 4 architecture, deterministic from a seed, whose
// weights sit on the QAT grid exactly as Google's exports do (every group of 32 input columns is step x level,
// level in -8..7, the peak not always at 8, some all-zero groups). Written as a stream: a full-size E2B
// (about 10 GB) never has to fit in memory.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "formats/model_config.h"

namespace qs {

enum class CheckpointFormat { Bf16, W4A16 };

struct SynthOptions {
  std::string preset;                   // a name from synth_preset_names(), or empty with config_file
  std::filesystem::path config_file;
  CheckpointFormat format = CheckpointFormat::Bf16;
  std::filesystem::path out;
  uint64_t seed = 0;
  std::optional<std::filesystem::path> tokenizer_dir;  // its files are copied into the checkpoint
  // The vision and audio towers the config describes, every tensor with the real shapes and names
  // (model/gemma4_tower_tensors.h); default: when the config has any. Their linears sit on the QAT grid like the
  // text model's; w4a16 packs them but the embedders' projections (Google's `ignore`), unless towers_bf16 keeps
  // them bf16 (on `ignore`), as a ct export may.
  std::optional<bool> towers;
  bool towers_bf16 = false;
  bool towers_only = false;             // no text decoder: the towers and the config (tower benchmarks)
  std::optional<bool> lm_head;          // a redundant byte copy of the tied embedding; default: w4a16 only
  uint64_t max_shard_bytes = 4ull << 30;
  bool progress = true;
  // Planted faults, for tests of everything that reads checkpoints.
  std::string fault_off_grid;           // tensor whose first group is pushed off the grid
  std::string fault_missing;            // tensor left out
  bool fault_truncate = false;          // last shard cut short after writing
};

std::vector<std::string> synth_preset_names();
std::string preset_config_text(const std::string& name);  // throws listing the presets when unknown

struct SynthResult {
  uint64_t tensors = 0, bytes = 0;
  double seconds = 0;
};
SynthResult synth_checkpoint(const SynthOptions& options);

}  // namespace qs
