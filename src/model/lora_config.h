#pragma once
// adapter_config.json of a PEFT LoRA adapter, read as PEFT's LoraConfig reads it, and PEFT's rules for which
// modules an adapter targets (peft/tuners/tuners_utils.py check_target_module_exists) and at what scale
// (peft/tuners/lora/layer.py update_layer: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora), and which
// parameters `target_parameters` puts LoRA on (tuners_utils.py _inject_parameters: the MoE experts' fused weights,
// model/lora_experts.h). Options that change the computation in ways qatserve does not implement (DoRA,
// modules_to_save, biases, layer selection) are refused by name rather than ignored.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qs {

struct LoraPattern {  // rank_pattern / alpha_pattern: a key matched as PEFT's get_pattern_key matches it
  std::string key;
  double value = 0;
};

struct LoraConfig {
  std::string file;  // adapter_config.json's path, for messages
  int64_t r = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
  // target_modules: a list (a module matches when its name equals an entry or ends with "." + entry) or a string
  // (a regular expression the whole name must match; "all-linear": every linear but the output layer).
  std::vector<std::string> target_list;
  std::optional<std::string> target_regex;
  bool all_linear = false;
  // exclude_modules, which wins over the targets: a list (matched as target_modules' list is) or a regular
  // expression the whole name must match. PEFT's all-linear on Gemma4ForConditionalGeneration reaches the towers;
  // excluding them (e.g. ".*(vision_tower|audio_tower|embed_vision|embed_audio).*") keeps the adapter to the text.
  std::vector<std::string> exclude_list;
  std::optional<std::string> exclude_regex;
  // target_parameters: full parameter names (e.g. "model.layers.0.experts.gate_up_proj") or their suffixes after a
  // ".", as PEFT matches them; empty: LoRA on modules only. With it, target_modules may be empty or absent.
  std::vector<std::string> target_parameters;
  std::vector<LoraPattern> rank_pattern, alpha_pattern;
  std::string base_model_name_or_path;  // informational

  // Whether PEFT would put a LoRA layer on the module of this full name (e.g. "model.layers.0.self_attn.q_proj").
  bool targets(const std::string& module) const;
  bool excludes(const std::string& module) const;  // exclude_modules names it
  // Whether target_parameters names the parameter of this full name (e.g. "model.layers.0.experts.down_proj").
  bool targets_parameter(const std::string& parameter) const;
  // The rank and scale PEFT gives that module or targeted parameter (rank_pattern / alpha_pattern first, matched on
  // its full name, else r / lora_alpha).
  int64_t rank_of(const std::string& module) const;
  float scale_of(const std::string& module) const;
};

// Reads and validates DIR/adapter_config.json; throws qs::Error naming the file and the field at fault.
LoraConfig read_lora_config(const std::filesystem::path& dir);

}  // namespace qs
