#include "model/lora_adapter.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <span>

#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "kernels/ops.h"
#include "model/gemma4.h"
#include "model/gemma4_tower_tensors.h"
#include "model/kv_disk_tier.h"
#include "util/error.h"
#include "util/file.h"
#include "util/parallel.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kKeyPrefix = "base_model.model.";

// Why a module outside adaptable_linears cannot be adapted, by what its name says it is.
std::string why_not_adaptable(const std::string& module) {
  if (module.find(".experts") != std::string::npos)
    return "the MoE experts are parameters in transformers, adapted through target_parameters (experts.gate_up_proj, "
           "experts.down_proj) only, and no expert parameter that adapter_config.json targets is saved under this name";
  if (module.find("audio") != std::string::npos || module.find("vision") != std::string::npos)
    return "the base has no such linear of a tower or embedder (a model's towers and embedders are adapted when its "
           "config.json describes them: vision_config, audio_config)";
  if (module.ends_with("lm_head") || module.find("embed") != std::string::npos)
    return "the embeddings and the LM head are not adapted";
  return "the base model has no such linear";
}

// IEEE half to float, exactly (every half is a float); written out because clang before 15 has no x86 _Float16.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float subnormal = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -subnormal : subnormal;
}

std::vector<float> to_f32(const TensorEntry& t, std::span<const std::byte> bytes, const std::string& label) {
  std::vector<float> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::F32) {
      out[i] = load_unaligned<float>(bytes.data() + 4 * i);
    } else if (t.dtype == DType::BF16) {
      out[i] = bf16_to_f32(load_unaligned<uint16_t>(bytes.data() + 2 * i));
    } else if (t.dtype == DType::F16) {
      out[i] = f16_to_f32(load_unaligned<uint16_t>(bytes.data() + 2 * i));
    } else {
      throw Error(fmt::format("{}: tensor {} is {}, expected F32, BF16 or F16", label, t.name, dtype_name(t.dtype)));
    }
  }
  return out;
}

struct LoraTensorName {
  std::string module;
  bool is_a = false;
};

// "base_model.model.<module>.lora_A.weight" / "...lora_B.weight", as PEFT saves them (adapter name stripped).
LoraTensorName parse_tensor_name(const std::string& name, const std::string& label) {
  for (auto [suffix, is_a] : {std::pair{".lora_A.weight", true}, std::pair{".lora_B.weight", false}})
    if (name.starts_with(kKeyPrefix) && name.ends_with(suffix) && name.size() > kKeyPrefix.size() + strlen(suffix))
      return {name.substr(kKeyPrefix.size(), name.size() - kKeyPrefix.size() - strlen(suffix)), is_a};
  throw Error(fmt::format("{}: tensor {} is no LoRA weight (expected base_model.model.<module>.lora_A.weight or "
                          ".lora_B.weight; DoRA magnitudes, embedding adapters and saved modules are not supported)",
                          label, name));
}

// The 12B's embedders as transformers names its modules (PEFT's names) and as its files name the tensors (Google's,
// which transformers renames on load).
constexpr std::pair<std::string_view, std::string_view> kUnifiedEmbedderNames[] = {
    {"model.embed_vision.patch_dense", "model.vision_embedder.patch_dense"},
    {"model.embed_vision.multimodal_embedder.embedding_projection", "model.embed_vision.embedding_projection"}};

// "model.language_model." (Gemma4ForConditionalGeneration, whose towers' modules also say so) or "model."
// (Gemma4ForCausalLM), from the module names.
std::string module_prefix(const std::vector<LoraTensorName>& names, const std::string& label) {
  const bool conditional = std::any_of(names.begin(), names.end(), [](const LoraTensorName& n) {
    return n.module.starts_with("model.language_model.") || is_tower_tensor(n.module);
  });
  const std::string prefix = conditional ? "model.language_model." : "model.";
  for (const LoraTensorName& n : names)
    if (conditional ? !n.module.starts_with(prefix) && !is_tower_tensor(n.module) : !n.module.starts_with(prefix))
      throw Error(fmt::format("{}: modules {} and {} come from different model classes", label,
                              names.front().module, n.module));
  return prefix;
}

// A target_modules entry that names no text linear is a mistake, unless the base has towers: PEFT saves the names
// all-linear found there too (`linear`, `input_proj`, ...), and excluding the towers leaves those entries unused.
void check_targets_exist(const LoraConfig& c, const std::vector<AdaptableLinear>& linears, bool towers) {
  auto matches = [&](auto&& pred) { return std::any_of(linears.begin(), linears.end(), pred); };
  for (const std::string& t : c.target_list)
    if (!towers && !matches([&](const AdaptableLinear& l) { return l.module == t || l.module.ends_with("." + t); }))
      throw Error(fmt::format("{}: target_modules entry '{}' matches no linear of the base model's text decoder ({})",
                              c.file, t, why_not_adaptable(t)));
  const bool modules_only_empty = c.target_list.empty() && !c.target_regex && !c.all_linear;  // target_parameters
  if (!modules_only_empty && !matches([&](const AdaptableLinear& l) { return c.targets(l.module); }))
    throw Error(fmt::format("{}: target_modules matches no linear of the base model's text decoder", c.file));
}

// What the adapter computes, from its two files' bytes (never 0): equal for equal adapters in any process, so a
// prefix cached on disk under it (kv_disk_tier.h) is found again after a restart and never by another adapter.
// One of an expert parameter's two tensors (lora_experts.h: A [E * r, in], B [out, r * E]), checked and stored; on
// a base whose activations round to bf16, rounded to bf16 as PEFT's bf16 model uses them.
void load_expert_tensor(const TensorEntry& t, std::span<const std::byte> bytes, bool is_a, const ExpertTarget& target,
                        const LoraConfig& c, const Gemma4TextConfig& text, bool round_bf16, int64_t max_rank,
                        const std::string& label, ExpertLoraWeights& w) {
  const int64_t E = text.num_experts, H = text.hidden_size, I = text.moe_intermediate_size;
  const bool gate_up = target.param == ExpertParam::GateUp;
  const int64_t in = gate_up ? H : I, out = gate_up ? 2 * I : H, rank = c.rank_of(target.parameter);
  if (rank > max_rank)
    throw Error(fmt::format("{}: expert parameter {} has rank {}, over the limit of {} (--max-lora-rank)", label,
                            target.parameter, rank, max_rank));
  const std::vector<int64_t> want = is_a ? std::vector{E * rank, in} : std::vector{out, rank * E};
  if (t.shape != want)
    throw Error(fmt::format("{}: tensor {} has shape [{}], expected [{}] (base {} is [{}, {}, {}], rank {}: lora_A "
                            "[experts * rank, in], lora_B [out, rank * experts])",
                            label, t.name, fmt::join(t.shape, ", "), fmt::join(want, ", "), target.parameter, E, out,
                            in, rank));
  w.parameter = target.parameter, w.experts = E, w.rank = rank, w.in = in, w.out = out;
  w.scale = c.scale_of(target.parameter);
  std::vector<float> values = to_f32(t, bytes, label);
  if (round_bf16)  // PEFT's bf16 model: get_delta_factors casts A and B to the weight's dtype
    for (float& v : values) v = round_to_bf16(v);
  if (is_a) w.set_a(std::move(values));
  else w.set_b(values);
}

// [out, in] of a linear of the base's towers or embedders by PEFT's module name (its `.weight`, or the int4 export's
// `.weight_packed` [out, in / 8]), when config.json describes that tower (the 12B's encoder-free embedders
// included) and the checkpoint has that linear.
std::optional<std::array<int64_t, 2>> tower_linear_shape(const Gemma4Model& base, const std::string& peft_module) {
  const ModelConfig& c = base.config();
  const std::string module = tower_checkpoint_module(c, peft_module);
  if (module.empty()) return std::nullopt;
  const bool described = is_tower_tensor(module, Tower::Vision) ? c.vision || c.unified_vision
                         : is_tower_tensor(module, Tower::Audio) ? c.has_audio
                                                                 : false;
  if (!described) return std::nullopt;
  if (const TensorRef* t = base.checkpoint().find(module + ".weight"); t && t->shape().size() == 2)
    return std::array{t->shape()[0], t->shape()[1]};
  if (const TensorRef* t = base.checkpoint().find(module + ".weight_packed"); t && t->shape().size() == 2)
    return std::array{t->shape()[0], t->shape()[1] * 8};
  return std::nullopt;
}

// The tower linears of the base (PEFT's module names), for the check that each targeted one has A and B.
std::vector<std::string> tower_linears(const Gemma4Model& base) {
  std::vector<std::string> out;
  for (const TensorRef& t : base.checkpoint().tensors())
    for (const std::string_view suffix : {std::string_view(".weight"), std::string_view(".weight_packed")})
      if (t.name().ends_with(suffix)) {
        std::string module = tower_peft_module(base.config(), t.name().substr(0, t.name().size() - suffix.size()));
        if (tower_linear_shape(base, module)) out.push_back(std::move(module));
      }
  return out;
}

// One of a linear's two tensors, checked against its [out, in] and rank: A kept as stored, B transposed.
void load_linear_tensor(const TensorEntry& t, std::span<const std::byte> bytes, bool is_a, const std::string& module,
                        int64_t out, int64_t in, const LoraConfig& c, int64_t max_rank, const std::string& label,
                        LoraWeights& lw) {
  const int64_t rank = c.rank_of(module);
  if (rank > max_rank)
    throw Error(fmt::format("{}: module {} has rank {}, over the limit of {} (--max-lora-rank)", label, module, rank,
                            max_rank));
  const std::vector<int64_t> want = is_a ? std::vector{rank, in} : std::vector{out, rank};
  if (t.shape != want)
    throw Error(fmt::format("{}: tensor {} has shape [{}], expected [{}] (base {} is [{}, {}], rank {})", label,
                            t.name, fmt::join(t.shape, ", "), fmt::join(want, ", "), module, out, in, rank));
  lw.module = module, lw.rank = rank, lw.in = in, lw.out = out, lw.scale = c.scale_of(module);
  if (is_a) {
    lw.a = to_f32(t, bytes, label);
  } else {
    const std::vector<float> b = to_f32(t, bytes, label);
    lw.bt.resize(b.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < rank; ++k) lw.bt[k * out + o] = b[o * rank + k];
  }
}

uint64_t content_id(const fs::path& config, const fs::path& weights) {
  const std::string a = read_file(config), b = read_file(weights);
  const uint64_t id = hash_bytes(std::as_bytes(std::span(b.data(), b.size())), hash_text(a));
  return id ? id : 1;
}

}  // namespace

std::vector<AdaptableLinear> adaptable_linears(const Gemma4Model& model, const std::string& prefix) {
  std::vector<AdaptableLinear> out;
  auto add = [&](std::string module, const LinearWeight& w) {
    if (w.out > 0) out.push_back({std::move(module), &w});  // absent: KV-shared k/v, v of attention_k_eq_v
  };
  add(prefix + "per_layer_model_projection", model.per_layer_model_projection());
  for (size_t l = 0; l < model.layers().size(); ++l) {
    const Gemma4Layer& L = model.layers()[l];
    const std::string p = fmt::format("{}layers.{}.", prefix, l);
    add(p + "self_attn.q_proj", L.q_proj), add(p + "self_attn.k_proj", L.k_proj);
    add(p + "self_attn.v_proj", L.v_proj), add(p + "self_attn.o_proj", L.o_proj);
    add(p + "mlp.gate_proj", L.gate_proj), add(p + "mlp.up_proj", L.up_proj), add(p + "mlp.down_proj", L.down_proj);
    add(p + "router.proj", L.router_proj);
    add(p + "per_layer_input_gate", L.per_layer_input_gate), add(p + "per_layer_projection", L.per_layer_projection);
  }
  return out;
}

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const fs::path& dir, const Gemma4Model& base, std::string name,
                                                     int64_t max_rank) {
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name_ = std::move(name);
  adapter->dir_ = dir;
  adapter->config_ = read_lora_config(dir);
  const LoraConfig& c = adapter->config_;
  const fs::path file = dir / "adapter_model.safetensors";
  const std::string label = file.string();
  if (!fs::is_regular_file(file))
    throw Error(fmt::format("{}: missing (only safetensors adapters are read; save with safe_serialization=True)",
                            label));
  adapter->id_ = content_id(dir / "adapter_config.json", file);
  const SafetensorsFile st = SafetensorsFile::open(file);
  if (st.tensors().empty()) throw Error(fmt::format("{}: holds no tensors", label));
  std::vector<LoraTensorName> names;
  for (const TensorEntry& t : st.tensors()) names.push_back(parse_tensor_name(t.name, label));
  const std::string prefix = module_prefix(names, label);
  const std::vector<AdaptableLinear> linears = adaptable_linears(base, prefix);
  check_targets_exist(c, linears, base.config().has_vision || base.config().has_audio);
  std::map<std::string, const LinearWeight*> by_module;
  for (const AdaptableLinear& l : linears) by_module[l.module] = l.weight;
  const std::vector<ExpertTarget> experts = expert_targets(c, base, prefix);
  std::map<std::string, const ExpertTarget*> expert_by_module;
  for (const ExpertTarget& e : experts) expert_by_module[e.module] = &e;

  std::map<std::string, int> seen;  // module -> bit 1: A, bit 2: B
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorEntry& t = st.tensors()[i];
    const std::string& module = names[i].module;
    if (auto e = expert_by_module.find(module); e != expert_by_module.end()) {
      const ExpertTarget& target = *e->second;
      ExpertLoraWeights& w = adapter->experts_[&base.layers()[target.layer]][static_cast<int>(target.param)];
      load_expert_tensor(t, st.data(t), names[i].is_a, target, c, base.config().text, base.rounds_to_bf16(), max_rank,
                         label, w);
      seen[module] |= names[i].is_a ? 1 : 2;
      adapter->max_rank_ = std::max(adapter->max_rank_, w.rank);
      continue;
    }
    auto it = by_module.find(module);
    const auto tower_shape = it == by_module.end() ? tower_linear_shape(base, module) : std::nullopt;
    if (it == by_module.end() && !tower_shape)
      throw Error(fmt::format("{}: tensor {}: module {} cannot be adapted: {}", label, t.name, module,
                              why_not_adaptable(module)));
    if (!c.targets(module))
      throw Error(fmt::format("{}: tensor {}: module {} is {} adapter_config.json's {}", label, t.name, module,
                              c.excludes(module) ? "excluded by" : "not among",
                              c.excludes(module) ? "exclude_modules" : "target_modules"));
    const int64_t out = tower_shape ? (*tower_shape)[0] : it->second->out;
    const int64_t in = tower_shape ? (*tower_shape)[1] : it->second->in;
    LoraWeights& lw = tower_shape ? adapter->tower_weights_[module] : adapter->weights_[it->second];
    load_linear_tensor(t, st.data(t), names[i].is_a, module, out, in, c, max_rank, label, lw);
    seen[module] |= names[i].is_a ? 1 : 2;
    adapter->max_rank_ = std::max(adapter->max_rank_, lw.rank);
  }
  std::vector<std::string> adaptable;
  for (const AdaptableLinear& l : linears) adaptable.push_back(l.module);
  if (prefix == "model.language_model.")
    for (std::string& module : tower_linears(base)) adaptable.push_back(std::move(module));
  for (const std::string& module : adaptable)
    if (c.targets(module) && seen[module] != 3)
      throw Error(fmt::format("{}: module {} is targeted but its {} is missing", label, module,
                              seen[module] == 1 ? "lora_B.weight" : seen[module] == 2 ? "lora_A.weight"
                                                                                      : "lora_A/lora_B weights"));
  for (const ExpertTarget& e : experts)
    if (seen[e.module] != 3)
      throw Error(fmt::format("{}: expert parameter {} is targeted but {}.{} is missing (PEFT saves it there)", label,
                              e.parameter, e.module,
                              seen[e.module] == 1 ? "lora_B.weight" : seen[e.module] == 2 ? "lora_A.weight"
                                                                                          : "lora_A/lora_B.weight"));
  return adapter;
}

uint64_t LoraAdapter::bytes() const {
  uint64_t total = 0;
  for (const auto& [w, lw] : weights_) total += (lw.a.size() + lw.bt.size()) * sizeof(float);
  for (const auto& [module, lw] : tower_weights_) total += (lw.a.size() + lw.bt.size()) * sizeof(float);
  for (const auto& [layer, params] : experts_)
    for (const ExpertLoraWeights& ew : params) total += (ew.a.size() + ew.bt.size()) * sizeof(float);
  return total;
}

const ExpertLoraWeights* LoraAdapter::find_experts(const Gemma4Layer* layer, ExpertParam param) const {
  auto it = experts_.find(layer);
  if (it == experts_.end()) return nullptr;
  const ExpertLoraWeights& w = it->second[static_cast<int>(param)];
  return w.present() ? &w : nullptr;
}

int64_t LoraAdapter::expert_parameters() const {
  int64_t n = 0;
  for (const auto& [layer, params] : experts_)
    for (const ExpertLoraWeights& ew : params) n += ew.present();
  return n;
}

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> rows(n);
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return rows;
}

std::string tower_checkpoint_module(const ModelConfig& config, const std::string& peft_module) {
  if (!config.is_unified()) return peft_module;
  for (auto [peft, disk] : kUnifiedEmbedderNames) {
    if (peft_module == peft) return std::string(disk);
    if (peft_module == disk) return "";  // a file's name, not a module of the model
  }
  return peft_module;
}

std::string tower_peft_module(const ModelConfig& config, const std::string& checkpoint_module) {
  if (config.is_unified())
    for (auto [peft, disk] : kUnifiedEmbedderNames)
      if (checkpoint_module == disk) return std::string(peft);
  return checkpoint_module;
}

const LoraWeights* LoraAdapter::find_tower(const std::string& module) const {
  auto it = tower_weights_.find(module);
  return it == tower_weights_.end() ? nullptr : &it->second;
}

const LoraWeights* LoraAdapter::find(const LinearWeight* w) const {
  auto it = weights_.find(w);
  return it == weights_.end() ? nullptr : &it->second;
}

void LoraWeights::add_to(const float* x, std::span<const int64_t> rows, float* y, bool round_bf16,
                         ThreadPool& pool) const {
  thread_local std::vector<LowRankRow> list;
  list.clear();
  for (int64_t row : rows) list.push_back({row, a.data(), bt.data(), rank, scale});
  const LowRankOutput all{0, out, y, out};
  add_low_rank(list, x, in, out, std::span(&all, 1), round_bf16, pool);
}

}  // namespace qs
