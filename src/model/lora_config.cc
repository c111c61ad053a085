#include "model/lora_config.h"

#include <fmt/format.h>

#include <cmath>
#include <regex>

#include "util/error.h"
#include "util/json_parse.h"

namespace qs {
namespace {

using Json = nlohmann::json;

bool set(const Json& j, const char* field) { return j.contains(field) && !j[field].is_null(); }

// A field PEFT would act on but qatserve does not implement: refused when it is set to anything but its default.
void refuse_if_set(const Json& j, const LoraConfig& c, const char* field, const char* why) {
  if (!set(j, field)) return;
  const Json& v = j[field];
  const bool is_default = (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
                          (v.is_object() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
  if (!is_default) throw Error(fmt::format("{}: {} = {} is not supported: {}", c.file, field, v.dump(), why));
}

std::regex compile(const std::string& pattern, const LoraConfig& c, const char* field) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw Error(fmt::format("{}: {} '{}' is not a valid regular expression ({})", c.file, field, pattern, e.what()));
  }
}

std::vector<LoraPattern> read_patterns(const Json& j, const LoraConfig& c, const char* field) {
  std::vector<LoraPattern> out;
  if (!set(j, field)) return out;
  if (!j[field].is_object()) throw Error(fmt::format("{}: {} must be an object of numbers", c.file, field));
  for (const auto& [key, value] : j[field].items()) {
    if (!value.is_number() || value.get<double>() <= 0)
      throw Error(fmt::format("{}: {}[\"{}\"] must be a positive number", c.file, field, key));
    compile("(.*\\.)?(" + key + ")", c, field);
    out.push_back({key, value.get<double>()});
  }
  return out;
}

// PEFT's get_pattern_key: the first key k for which re.match(rf"(.*\.)?({k})$", module) matches.
const LoraPattern* pattern_for(const std::vector<LoraPattern>& patterns, const std::string& module) {
  for (const LoraPattern& p : patterns)
    if (std::regex_match(module, std::regex("(.*\\.)?(" + p.key + ")"))) return &p;
  return nullptr;
}

std::vector<std::string> read_names(const Json& t, const LoraConfig& c, const char* field, const char* what) {
  if (!t.is_array()) throw Error(fmt::format("{}: {} must be a list of {}", c.file, field, what));
  std::vector<std::string> out;
  for (const Json& name : t) {
    if (!name.is_string() || name.get<std::string>().empty())
      throw Error(fmt::format("{}: {} holds {}, expected {}", c.file, field, name.dump(), what));
    out.push_back(name.get<std::string>());
  }
  return out;
}

void read_exclusions(const Json& j, LoraConfig& c) {
  if (!set(j, "exclude_modules")) return;
  const Json& e = j["exclude_modules"];
  if (e.is_string()) {
    if (!e.get<std::string>().empty()) compile(e.get<std::string>(), c, "exclude_modules"), c.exclude_regex = e;
    return;
  }
  if (!e.is_array()) throw Error(fmt::format("{}: exclude_modules must be a list of names or a string", c.file));
  c.exclude_list = read_names(e, c, "exclude_modules", "module names");
}

bool in_list(const std::vector<std::string>& names, const std::string& module) {
  for (const std::string& t : names)
    if (module == t || module.ends_with("." + t)) return true;
  return false;
}

void read_targets(const Json& j, LoraConfig& c) {
  // PEFT's target_parameters is a list (a string for regex matching is "not implemented yet" in PEFT itself).
  if (set(j, "target_parameters"))
    c.target_parameters = read_names(j["target_parameters"], c, "target_parameters", "parameter names");
  const bool parameters = !c.target_parameters.empty();
  if (!set(j, "target_modules")) {
    if (parameters) return;
    throw Error(fmt::format("{}: target_modules is missing", c.file));
  }
  const Json& t = j["target_modules"];
  if (t.is_string()) {
    const std::string s = t.get<std::string>();
    std::string lower = s;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "all-linear") c.all_linear = true;
    else compile(s, c, "target_modules"), c.target_regex = s;
    return;
  }
  if (!t.is_array()) throw Error(fmt::format("{}: target_modules must be a list of names or a string", c.file));
  c.target_list = read_names(t, c, "target_modules", "module names");
  if (c.target_list.empty() && !parameters)
    throw Error(fmt::format("{}: target_modules and target_parameters are both empty", c.file));
}

}  // namespace

bool LoraConfig::excludes(const std::string& module) const {
  if (exclude_regex) return std::regex_match(module, std::regex(*exclude_regex));
  return in_list(exclude_list, module);
}

bool LoraConfig::targets(const std::string& module) const {
  if (excludes(module)) return false;
  if (all_linear) return true;
  if (target_regex) return std::regex_match(module, std::regex(*target_regex));
  return in_list(target_list, module);
}

bool LoraConfig::targets_parameter(const std::string& parameter) const { return in_list(target_parameters, parameter); }

int64_t LoraConfig::rank_of(const std::string& module) const {
  const LoraPattern* p = pattern_for(rank_pattern, module);
  return p ? static_cast<int64_t>(p->value) : r;
}

float LoraConfig::scale_of(const std::string& module) const {
  const LoraPattern* p = pattern_for(alpha_pattern, module);
  const double alpha = p ? p->value : lora_alpha, rank = static_cast<double>(rank_of(module));
  return static_cast<float>(use_rslora ? alpha / std::sqrt(rank) : alpha / rank);
}

LoraConfig read_lora_config(const std::filesystem::path& dir) {
  LoraConfig c;
  const std::filesystem::path path = dir / "adapter_config.json";
  c.file = path.string();
  if (!std::filesystem::is_regular_file(path))
    throw Error(fmt::format("{}: no adapter_config.json (a PEFT adapter directory holds adapter_config.json and "
                            "adapter_model.safetensors)", dir.string()));
  const Json j = read_json_file(path);
  if (!j.is_object()) throw Error(fmt::format("{}: expected a JSON object", c.file));
  const std::string type = set(j, "peft_type") && j["peft_type"].is_string() ? j["peft_type"].get<std::string>() : "";
  if (type != "LORA") throw Error(fmt::format("{}: peft_type is '{}', expected LORA", c.file, type));
  if (!set(j, "r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0)
    throw Error(fmt::format("{}: r must be a positive integer", c.file));
  c.r = j["r"].get<int64_t>();
  if (!set(j, "lora_alpha") || !j["lora_alpha"].is_number())
    throw Error(fmt::format("{}: lora_alpha must be a number", c.file));
  c.lora_alpha = j["lora_alpha"].get<double>();
  if (set(j, "use_rslora")) {
    if (!j["use_rslora"].is_boolean()) throw Error(fmt::format("{}: use_rslora must be true or false", c.file));
    c.use_rslora = j["use_rslora"].get<bool>();
  }
  refuse_if_set(j, c, "use_dora", "DoRA (weight-decomposed LoRA) rescales each output column by a learned magnitude");
  refuse_if_set(j, c, "modules_to_save", "the adapter replaces whole modules; merge them into the base instead");
  refuse_if_set(j, c, "layers_to_transform", "layer selection is not implemented");
  refuse_if_set(j, c, "lora_bias", "LoRA biases are not implemented");
  refuse_if_set(j, c, "fan_in_fan_out", "only nn.Linear weights [out, in] are adapted");
  refuse_if_set(j, c, "use_qalora", "QALoRA pools the input; not implemented");
  refuse_if_set(j, c, "trainable_token_indices", "trainable tokens replace embedding rows; not implemented");
  refuse_if_set(j, c, "layer_replication", "layer replication is not implemented");
  refuse_if_set(j, c, "alora_invocation_tokens", "activated LoRA (aLoRA) is not implemented");
  for (const char* variant : {"use_bdlora", "arrow_config", "kasa_config", "monteclora_config", "velora_config"})
    refuse_if_set(j, c, variant, "this LoRA variant is not implemented");
  if (set(j, "bias") && j["bias"] != "none")
    throw Error(fmt::format("{}: bias = {} is not supported: only bias \"none\"", c.file, j["bias"].dump()));
  read_targets(j, c);
  read_exclusions(j, c);
  c.rank_pattern = read_patterns(j, c, "rank_pattern");
  c.alpha_pattern = read_patterns(j, c, "alpha_pattern");
  if (set(j, "base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  return c;
}

}  // namespace qs
