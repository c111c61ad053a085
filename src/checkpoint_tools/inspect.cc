#include "checkpoint_tools/inspect.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "checkpoint_tools/qat_rows.h"
#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "model/gemma4_tensors.h"
#include "model/gemma4_tower_tensors.h"
#include "quant/qat_grid.h"
#include "util/progress.h"

namespace qs {
namespace {

using ojson = nlohmann::ordered_json;
constexpr int kScanGroupSizes[] = {16, 32, 64, 128};

std::string variant_name(const Gemma4TextConfig& t) {
  struct Known { const char* name; int64_t hidden, layers; };
  for (auto k : {Known{"E2B", 1536, 35}, Known{"E4B", 2560, 42}, Known{"12B", 3840, 48}, Known{"26B-A4B", 2816, 30},
                 Known{"31B", 5376, 60}})
    if (t.hidden_size == k.hidden && t.num_hidden_layers == k.layers) return k.name;
  return "custom";
}

ojson dtype_summary(const Checkpoint& c) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> by;
  for (const auto& t : c.tensors()) {
    auto& e = by[std::string(dtype_name(t.dtype()))];
    ++e.first;
    e.second += t.nbytes();
  }
  ojson j = ojson::object();
  for (const auto& [d, e] : by) j[d] = {{"tensors", e.first}, {"bytes", e.second}};
  return j;
}

// Fraction of sampled groups of each size that sit exactly on some 4-bit grid.
ojson grid_scan(const TensorRef& t, int samples) {
  int64_t cols = t.shape().back(), rows = t.nbytes() / 2 / cols;
  Bf16Rows view{t.bytes().data(), cols};
  std::vector<float> row(cols);
  std::vector<int8_t> levels(cols);
  ojson out = ojson::object();
  for (int gs : kScanGroupSizes) {
    if (cols % gs) continue;
    int64_t groups_per_row = cols / gs, total = rows * groups_per_row, n = std::min<int64_t>(samples, total);
    int on = 0;
    for (int64_t k = 0; k < n; ++k) {
      int64_t idx = total * k / n, r = idx / groups_per_row, g = idx % groups_per_row;
      view.load(r, row.data());
      on += fit_qat_group({row.data() + g * gs, static_cast<size_t>(gs)}, {levels.data(), static_cast<size_t>(gs)})
                .on_grid;
    }
    out[std::to_string(gs)] = {{"sampled", n}, {"on_grid", on}};
  }
  return out;
}

bool is_weight_role(TensorRole r) {
  return r == TensorRole::Linear || r == TensorRole::FusedExperts || r == TensorRole::Embedding ||
         r == TensorRole::RouterLinear;
}

// One tower against its inventory: parameters (as the bf16 export counts them), its tensors found (a packed
// linear as its weight_packed), missing or misshapen, and how the file holds its linears.
ojson tower_report(const Checkpoint& c, const std::vector<ArchTensor>& tower) {
  int64_t parameters = 0, found = 0, int4 = 0, bf16 = 0;
  ojson missing = ojson::array(), mismatched = ojson::array();
  for (const ArchTensor& a : tower) {
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    parameters += n;
    const TensorRef* t = c.find(a.name);
    if (a.role == TensorRole::Linear && !t && c.find(a.module + ".weight_packed")) {
      ++found, ++int4;
      continue;
    }
    if (!t) {
      missing.push_back(a.name);
      continue;
    }
    ++found;
    if (t->shape() != a.shape) mismatched.push_back({{"tensor", a.name}, {"shape", t->shape()}, {"expected", a.shape}});
    if (a.role == TensorRole::Linear) ++bf16;
  }
  const bool absent = found == 0;
  if (absent) missing = ojson::array();  // a text-only file: nothing of the tower, which is fine
  return {{"in_file", !absent}, {"parameters", parameters}, {"tensors_expected", tower.size()}, {"tensors_found", found},
          {"missing", missing}, {"shape_mismatch", mismatched}, {"int4_linears", int4}, {"bf16_linears", bf16}};
}

void check_architecture(const Checkpoint& c, const ModelConfig& config, ojson& report, int samples) {
  std::vector<ArchTensor> arch = gemma4_text_tensors(config);
  std::set<std::string> accounted;
  ojson missing = ojson::array(), mismatched = ojson::array(), scan = ojson::object();
  int64_t packed_modules = 0, split_experts = 0;
  for (const auto& a : arch) {
    if (const TensorRef* t = c.find(a.name)) {
      accounted.insert(a.name);
      if (t->shape() != a.shape)
        mismatched.push_back({{"tensor", a.name}, {"shape", t->shape()}, {"expected", a.shape}});
      else if (t->dtype() == DType::BF16 && is_weight_role(a.role))
        scan[a.name] = grid_scan(*t, samples);
      t->release();
      continue;
    }
    if (c.find(a.module + ".weight_packed")) {
      for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape"}) accounted.insert(a.module + s);
      ++packed_modules;
      continue;
    }
    if (a.role == TensorRole::FusedExperts) {
      std::string layer = a.name.substr(0, a.name.find("experts."));
      std::vector<std::string> projs = a.name.ends_with("down_proj") ? std::vector<std::string>{"down_proj"}
                                                                     : std::vector<std::string>{"gate_proj", "up_proj"};
      bool all = true;
      for (int64_t e = 0; e < a.shape[0]; ++e)
        for (const auto& p : projs)
          for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape", ".weight"}) {
            std::string n = expert_module(layer, e, p) + s;
            if (c.find(n)) accounted.insert(n);
            else if (std::string(s) == ".weight_packed" && !c.find(expert_module(layer, e, p) + ".weight")) all = false;
          }
      if (all) {
        ++split_experts;
        continue;
      }
    }
    missing.push_back({{"tensor", a.name}, {"shape", a.shape}});
  }
  ojson tolerated = ojson::array(), unknown = ojson::array();
  auto extras = gemma4_tolerated_extras(config);
  int64_t towers = 0;
  for (const auto& t : c.tensors()) {
    if (accounted.count(t.name())) continue;
    if (std::find(extras.begin(), extras.end(), t.name()) != extras.end()) tolerated.push_back(t.name());
    else if (is_tower_tensor(t.name())) ++towers;
    else unknown.push_back(t.name());
  }
  const auto& tc = config.text;
  std::string absent_by_design;
  if (tc.num_kv_shared_layers > 0) {
    int64_t first = tc.first_shared_layer(), last = tc.num_hidden_layers - 1;
    bool has_any = false;
    for (int64_t l = first; l <= last; ++l)
      has_any |= c.find(fmt::format("{}layers.{}.self_attn.k_norm.weight", config.text_prefix(), l)) != nullptr;
    absent_by_design = has_any
        ? fmt::format("KV-shared layers {}-{} carry k_proj/v_proj/k_norm: unused (they read layers {} and {}), ignored",
                      first, last, tc.kv_source(last), tc.kv_source(first))
        : fmt::format("KV-shared layers {}-{} have no k_proj/v_proj/k_norm: fine, transformers builds none and they "
                      "reuse the K/V of earlier layers", first, last);
  }
  report["architecture"] = {{"expected_tensors", arch.size()}, {"missing", missing}, {"shape_mismatch", mismatched},
                            {"packed_modules", packed_modules}, {"split_expert_tensors", split_experts},
                            {"kv_shared_layers", absent_by_design}, {"tolerated_extras", tolerated},
                            {"tower_tensors", towers}, {"unknown_extras", unknown}};
  if (config.vision) {
    const Gemma4VisionConfig& v = *config.vision;
    ojson j = tower_report(c, gemma4_tower_tensors(config, Tower::Vision));
    j.update({{"layers", v.num_hidden_layers}, {"hidden_size", v.hidden_size}, {"patch_size", v.patch_size},
              {"pooling_kernel_size", v.pooling_kernel_size}, {"soft_tokens_per_image", v.soft_tokens_per_image},
              {"patches_per_image", v.soft_tokens_per_image * v.pooling_kernel_size * v.pooling_kernel_size}});
    report["architecture"]["vision_tower"] = j;
  }
  if (config.has_audio && !config.is_unified()) {  // the 12B's audio_config is its embedder's, below
    const Gemma4AudioConfig a = parse_audio_config(config, "config.json");
    ojson j = tower_report(c, gemma4_tower_tensors(config, Tower::Audio));
    // Feature frames every 10 ms; the subsampling's two stride-2 convolutions leave one soft token per 4 frames.
    j.update({{"layers", a.num_hidden_layers}, {"hidden_size", a.hidden_size}, {"frames_per_second", 100},
              {"soft_tokens_per_second", 25}});
    report["architecture"]["audio_tower"] = j;
  }
  if (config.is_unified()) {  // no towers: encoder-free embedders (0 where the config has none)
    report["architecture"]["unified_embedders"] = {
        {"image_patch_px", config.unified_vision ? config.unified_vision->model_patch_size() : 0},
        {"image_embed_dim", config.unified_vision ? config.unified_vision->mm_embed_dim : 0},
        {"audio_frame_samples", config.unified_audio ? config.unified_audio->audio_embed_dim : 0}};
  }
  report["grid_scan"] = scan;
}

std::string format_tower(const ojson& v) {
  std::string s = fmt::format("{:.1f} M parameters", v["parameters"].get<double>() / 1e6);
  if (!v["in_file"].get<bool>()) return s + ", not in the file (text only)";
  s += fmt::format(", {} of {} tensors; linears: {} int4, {} bf16", v["tensors_found"].get<int64_t>(),
                   v["tensors_expected"].get<int64_t>(), v["int4_linears"].get<int64_t>(),
                   v["bf16_linears"].get<int64_t>());
  for (const auto& m : v["missing"]) s += fmt::format("\n    missing: {}", m.get<std::string>());
  for (const auto& m : v["shape_mismatch"])
    s += fmt::format("\n    shape: {} is {}, expected {}", m["tensor"].get<std::string>(), m["shape"].dump(),
                     m["expected"].dump());
  return s;
}

}  // namespace

ojson inspect_checkpoint(const InspectOptions& opt) {
  Checkpoint c = Checkpoint::open(opt.path);
  ojson r;
  r["path"] = opt.path.string();
  r["shards"] = c.shards().size();
  r["tensors"] = c.tensors().size();
  r["bytes"] = c.total_tensor_bytes();
  r["by_dtype"] = dtype_summary(c);
  int64_t packed = 0;
  for (const auto& t : c.tensors()) packed += t.name().ends_with(".weight_packed");
  r["quantized_modules"] = packed;
  auto cfg_path = c.config_path();
  if (!cfg_path) {
    r["config"] = nullptr;
    r["note"] = "no config.json: tensors listed and validated, but they cannot be checked against an architecture";
    ojson list = ojson::array();
    for (const auto& t : c.tensors())
      list.push_back({{"name", t.name()}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}});
    r["tensor_list"] = list;
    return r;
  }
  ModelConfig config = read_model_config(*cfg_path);
  r["config"] = {{"model_type", config.model_type}, {"variant", variant_name(config.text)},
                 {"layers", config.text.num_hidden_layers}, {"hidden_size", config.text.hidden_size}};
  if (config.quantization) {
    std::string why = config.quantization->unsupported_reason();
    r["quantization"] = {{"quant_method", config.quantization->quant_method},
                         {"group_size", config.quantization->group_size()},
                         {"ignore_entries", config.quantization->ignore.size()},
                         {"supported", why.empty()}, {"unsupported_reason", why}};
  }
  check_architecture(c, config, r, opt.sample_groups);
  return r;
}

std::string format_inspection(const ojson& r) {
  std::string s = fmt::format("{}: {} tensors in {} shard(s), {}\n", r["path"].get<std::string>(),
                              r["tensors"].get<int64_t>(), r["shards"].get<int64_t>(),
                              format_bytes(r["bytes"].get<double>()));
  for (const auto& [d, e] : r["by_dtype"].items())
    s += fmt::format("  {:5} {:6} tensors  {}\n", d, e["tensors"].get<int64_t>(), format_bytes(e["bytes"].get<double>()));
  s += fmt::format("quantized modules (weight_packed): {}\n", r["quantized_modules"].get<int64_t>());
  if (r["config"].is_null()) return s + r["note"].get<std::string>() + "\n";
  const auto& c = r["config"];
  s += fmt::format("model: {} {} ({} layers, hidden {})\n", c["model_type"].get<std::string>(),
                   c["variant"].get<std::string>(), c["layers"].get<int64_t>(), c["hidden_size"].get<int64_t>());
  if (r.contains("quantization")) {
    const auto& q = r["quantization"];
    s += fmt::format("quantization: {} group {} ({} ignore entries){}\n", q["quant_method"].get<std::string>(),
                     q["group_size"].get<int64_t>(), q["ignore_entries"].get<int64_t>(),
                     q["supported"].get<bool>() ? "" : ", NOT supported: " + q["unsupported_reason"].get<std::string>());
  }
  const auto& a = r["architecture"];
  s += fmt::format("architecture: {} tensors expected; {} missing, {} misshapen, {} packed modules, {} split expert tensors\n",
                   a["expected_tensors"].get<int64_t>(), a["missing"].size(), a["shape_mismatch"].size(),
                   a["packed_modules"].get<int64_t>(), a["split_expert_tensors"].get<int64_t>());
  for (const auto& m : a["missing"]) s += fmt::format("  missing: {} {}\n", m["tensor"].get<std::string>(), m["shape"].dump());
  for (const auto& m : a["shape_mismatch"])
    s += fmt::format("  shape: {} is {}, expected {}\n", m["tensor"].get<std::string>(), m["shape"].dump(),
                     m["expected"].dump());
  if (!a["kv_shared_layers"].get<std::string>().empty()) s += "  " + a["kv_shared_layers"].get<std::string>() + "\n";
  if (!a["tolerated_extras"].empty())
    s += fmt::format("  {} tolerated extras (ignored by loaders), e.g. {}\n", a["tolerated_extras"].size(),
                     a["tolerated_extras"][0].get<std::string>());
  if (a["tower_tensors"].get<int64_t>()) s += fmt::format("  {} vision/audio tower tensors (not read by the text model)\n", a["tower_tensors"].get<int64_t>());
  if (a.contains("vision_tower")) {
    const auto& v = a["vision_tower"];
    s += fmt::format("  vision tower: {} layers, hidden {}, patch {}, pooling {}x{}, {} soft tokens per image ({} patches)"
                     "; {}\n", v["layers"].get<int64_t>(), v["hidden_size"].get<int64_t>(),
                     v["patch_size"].get<int64_t>(), v["pooling_kernel_size"].get<int64_t>(),
                     v["pooling_kernel_size"].get<int64_t>(), v["soft_tokens_per_image"].get<int64_t>(),
                     v["patches_per_image"].get<int64_t>(), format_tower(v));
  }
  if (a.contains("audio_tower")) {
    const auto& v = a["audio_tower"];
    s += fmt::format("  audio tower: {} conformer layers, hidden {}, {} feature frames/s, {} soft tokens/s; {}\n",
                     v["layers"].get<int64_t>(), v["hidden_size"].get<int64_t>(),
                     v["frames_per_second"].get<int64_t>(), v["soft_tokens_per_second"].get<int64_t>(),
                     format_tower(v));
  }
  if (a.contains("unified_embedders")) {
    const auto& e = a["unified_embedders"];
    s += fmt::format("  encoder-free embedders: image {}-px patches -> {} wide, audio frames of {} samples\n",
                     e["image_patch_px"].get<int64_t>(), e["image_embed_dim"].get<int64_t>(),
                     e["audio_frame_samples"].get<int64_t>());
  }
  for (const auto& u : a["unknown_extras"]) s += fmt::format("  unknown extra: {}\n", u.get<std::string>());
  std::map<std::string, std::pair<int, int>> per_size;  // group size -> (tensors fully on grid, tensors scanned)
  std::vector<std::string> off32;
  for (const auto& [name, sizes] : r["grid_scan"].items())
    for (const auto& [gs, v] : sizes.items()) {
      auto& e = per_size[gs];
      bool all = v["on_grid"] == v["sampled"];
      e.first += all;
      ++e.second;
      if (gs == "32" && !all) off32.push_back(name);
    }
  if (!per_size.empty()) {
    s += "grid scan (sampled groups of bf16 weights on a 4-bit grid step x level, level -8..7):\n";
    for (int gs : kScanGroupSizes)
      if (auto it = per_size.find(std::to_string(gs)); it != per_size.end())
        s += fmt::format("  group {:3}: {:4}/{} tensors entirely on grid{}\n", gs, it->second.first, it->second.second,
                         it->second.first == it->second.second ? "  <- exact" : "");
    for (const auto& n : off32) s += fmt::format("  off grid at 32: {}\n", n);
  }
  return s;
}

}  // namespace qs
