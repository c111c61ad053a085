#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "formats/checkpoint.h"
#include "model/gemma4_tower_tensors.h"
#include "model/gemma4_tensors.h"
#include "quant/qat_grid.h"
#include "util/error.h"
#include "util/file.h"
#include "util/progress.h"

namespace qs {
namespace {

constexpr uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr uint64_t kFixedReserve = 256 * kMiB;
constexpr uint64_t kAcceleratorReserve = 1 * kGiB;
constexpr uint64_t kWeightShapeBytes = 16;  // weight_shape: I64 [2] per packed module

WeightClass class_of(const ArchTensor& a) {
  switch (a.role) {
    case TensorRole::Embedding: return WeightClass::Embeddings;
    case TensorRole::PerLayerEmbedding: return WeightClass::PerLayerEmbeddings;
    case TensorRole::FusedExperts: return WeightClass::Experts;
    case TensorRole::RouterLinear:
    case TensorRole::RouterVector: return WeightClass::Router;
    case TensorRole::Norm: return WeightClass::Norms;
    case TensorRole::LayerScalar:
    case TensorRole::ClipBound:
    case TensorRole::TowerParameter: return WeightClass::Other;
    case TensorRole::Linear: break;
  }
  if (a.module.find(".self_attn.") != std::string::npos) return WeightClass::Attention;
  if (a.module.find(".mlp.") != std::string::npos) return WeightClass::Mlp;
  return WeightClass::PerLayerEmbeddings;  // per_layer_model_projection, per_layer_input_gate, per_layer_projection
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// One packed module as compressed-tensors stores it: int4 values, a bf16 scale per group, the original shape.
uint64_t packed_bytes(int64_t out, int64_t in, int64_t group) {
  return uint64_t(out) * in / 2 + uint64_t(out) * ((in + group - 1) / group) * 2 + kWeightShapeBytes;
}

// gemma4_unified's encoder-free embedders, bf16 in both formats (Google's w4a16 ignore list keeps them): the image
// embedder's LayerNorm (weight, bias) over a 48-px patch, Linear to mm_embed_dim (bias), LayerNorm, the factorized
// position table [mm_posemb_size, 2, mm_embed_dim], LayerNorm and the projection to the text width (the
// pre-projection RMSNorm has no scale); the audio embedder's projection of a 640-sample frame likewise.
uint64_t unified_embedder_bytes(const ModelConfig& c) {
  const uint64_t H = c.text.hidden_size;
  uint64_t values = 0;
  if (c.unified_vision) {
    const uint64_t P = c.unified_vision->patch_values(), E = c.unified_vision->mm_embed_dim;
    values += 2 * P + (E * P + E) + 2 * E + uint64_t(c.unified_vision->mm_posemb_size) * 2 * E + 2 * E + H * E;
  }
  if (c.unified_audio) values += H * c.unified_audio->audio_embed_dim;
  return values * 2;
}

// Tower tensors as a checkpoint of `format` stores them: w4a16 packs the linears the export packs (whose input is a
// whole number of groups), everything else bf16.
uint64_t tower_bytes(const std::vector<ArchTensor>& tensors, WeightFormat format, int64_t group) {
  uint64_t bytes = 0;
  for (const ArchTensor& t : tensors)
    bytes += format == WeightFormat::W4A16 && t.quantized_in_w4a16 && t.shape[1] % group == 0
                 ? packed_bytes(t.shape[0], t.shape[1], group)
                 : numel(t.shape) * 2;
  return bytes;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// "48G", "48GiB", "48GB", "1.5T", "512M": binary units. Returns 0 when `s` is not a size.
uint64_t parse_device_size(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    return 0;
  }
  std::string unit = lower(s.substr(pos));
  static const std::map<std::string, double> units = {
      {"k", 1024.0}, {"kb", 1024.0}, {"kib", 1024.0}, {"m", 1048576.0}, {"mb", 1048576.0}, {"mib", 1048576.0},
      {"g", 1073741824.0}, {"gb", 1073741824.0}, {"gib", 1073741824.0},
      {"t", 1099511627776.0}, {"tb", 1099511627776.0}, {"tib", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end() || !(v > 0) || v * it->second > 1e18) return 0;
  return static_cast<uint64_t>(v * it->second);
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

}  // namespace

std::string_view weight_class_name(WeightClass c) {
  static constexpr std::string_view names[kWeightClasses] = {
      "embeddings", "per-layer embeddings", "attention", "mlp", "experts", "router", "norms", "other"};
  return names[static_cast<size_t>(c)];
}

uint64_t WeightBytes::total() const {
  uint64_t n = 0;
  for (uint64_t b : by_class) n += b;
  return n;
}

void WeightBytes::add_int4_lm_head(uint64_t bytes) {
  lm_head_int4 = bytes;
  gathered_by_row += (*this)[WeightClass::Embeddings];
}

WeightFormat parse_weight_format(const std::string& name) {
  if (name == "bf16") return WeightFormat::Bf16;
  if (name == "w4a16") return WeightFormat::W4A16;
  throw Error(fmt::format("weight format '{}': expected bf16 or w4a16", name));
}

WeightBytes weight_bytes_from_config(const ModelConfig& config, WeightFormat format) {
  const int64_t group = config.quantization && config.quantization->group_size() > 0
                            ? config.quantization->group_size() : kQatGroupSize;
  WeightBytes w;
  w.source = format == WeightFormat::W4A16 ? fmt::format("w4a16 weights (int4, group {}) computed from the config", group)
                                           : "bf16 weights computed from the config";
  // gemma4_text_tensors lists the tied embedding once and no lm_head: the LM head is counted once by design.
  for (const ArchTensor& a : gemma4_text_tensors(config)) {
    uint64_t bytes = numel(a.shape) * 2;
    if (format == WeightFormat::W4A16 && a.quantized_in_w4a16) {
      if (a.role == TensorRole::FusedExperts) {
        // Packed per expert, gate_up_proj [E, 2I, H] as separate gate and up modules of [I, H].
        const int64_t E = a.shape[0], R = a.shape[1], C = a.shape[2];
        const bool gate_up = a.name.ends_with("gate_up_proj");
        bytes = gate_up ? 2 * E * packed_bytes(R / 2, C, group) : E * packed_bytes(R, C, group);
      } else {
        bytes = packed_bytes(a.shape[0], a.shape[1], group);
      }
    }
    w[class_of(a)] += bytes;
    if (a.role == TensorRole::PerLayerEmbedding) w.gathered_by_row += bytes;
  }
  w.towers = tower_bytes(gemma4_tower_tensors(config), format, group);
  w.towers += unified_embedder_bytes(config);
  return w;
}

WeightBytes weight_bytes_from_checkpoint(const Checkpoint& checkpoint, const ModelConfig& config) {
  const ArchTensorIndex index(config);
  WeightBytes w;
  w.source = fmt::format("weights as stored in its files ({} of tensors)",
                         format_bytes(static_cast<double>(checkpoint.total_tensor_bytes())));
  for (const TensorRef& t : checkpoint.tensors()) {
    if (const ArchTensor* a = index.find(t.name())) {
      w[class_of(*a)] += t.nbytes();
      if (a->role == TensorRole::PerLayerEmbedding) w.gathered_by_row += t.nbytes();
    } else {  // not loaded by the text model: towers, the redundant lm_head copy, k/v of KV-shared layers, unknowns
      (is_tower_tensor(t.name()) ? w.towers : w.unused) += t.nbytes();
    }
  }
  return w;
}

AudioTowerPlan audio_tower_plan(const Gemma4AudioConfig& a, int64_t text_hidden, WeightFormat format,
                                int64_t frames) {
  AudioTowerPlan plan;
  plan.weights = tower_bytes(gemma4_audio_tensors(a, text_hidden), format, kQatGroupSize);
  // Frames after each stride-2 subsampling, mel bins likewise: buffers of the subsampling (input, layer 0's output,
  // layer 1's, the patch block of ~2^20 values) and of the conformer (16 rows of hidden per frame: the residual
  // stream and its copies, q/k/v/attention output, clipped inputs, the 4 x hidden feed-forward).
  const int64_t C0 = a.subsampling_conv_channels[0], C1 = a.subsampling_conv_channels[1], H = a.hidden_size;
  const int64_t T1 = (frames + 1) / 2, T2 = (T1 + 1) / 2, F = C0 / 4 * 4, F1 = (F + 1) / 2, F2 = (F1 + 1) / 2;
  const uint64_t subsampling = uint64_t(frames) * F + uint64_t(T1) * F1 * C0 + uint64_t(T2) * F2 * C1 + (1u << 20);
  const uint64_t conformer = uint64_t(T2) * H * 16;
  plan.activations = 4 * std::max(subsampling, conformer);
  plan.soft_tokens = T2;
  return plan;
}

const std::vector<Device>& device_presets() {
  // Capacity as the device reports it: the nvidia-smi total for the GPUs, the HBM per chip for the TPUs.
  static const std::vector<Device> presets = {
      {"tpu-v5e", 16 * kGiB, true, "TPU v5e, 16 GiB HBM per chip"},
      {"tpu-v6e", 32 * kGiB, true, "TPU v6e, 32 GiB HBM per chip"},
      {"l4", 23034 * kMiB, true, "NVIDIA L4 24 GB (23034 MiB usable)"},
      {"h100", 81559 * kMiB, true, "NVIDIA H100 80 GB (81559 MiB usable)"},
      {"h200", 143771 * kMiB, true, "NVIDIA H200 141 GB (143771 MiB usable)"},
  };
  return presets;
}

uint64_t meminfo_total_bytes(std::string_view text, std::string_view label) {
  std::istringstream in{std::string(text)};
  std::string key, unit;
  uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (ls >> key >> value >> unit && key == "MemTotal:" && unit == "kB" && value > 0) return value * 1024;
  }
  throw Error(fmt::format("{}: no 'MemTotal: <n> kB' line, which the cpu device reads for this machine's RAM", label));
}

CgroupFiles CgroupFiles::of_this_process() {
  CgroupFiles c;
  if (const char* root = std::getenv("QATSERVE_CGROUP_ROOT"); root && *root) c.root = root;
  std::ifstream f("/proc/self/cgroup");
  std::stringstream text;
  text << f.rdbuf();
  c.self_cgroup = text.str();
  return c;
}

namespace {

// "max" -> nullopt; a decimal byte count -> it; anything else throws naming the file.
std::optional<uint64_t> read_limit_file(const std::filesystem::path& file) {
  std::string text = read_file(file);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text == "max") return std::nullopt;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw Error(fmt::format("{}: '{}' is not a memory limit (expected a number of bytes or \"max\")", file.string(),
                            text));
  return value;
}

// The cgroup's directory under `base` and each of its ancestors up to `base`, innermost first; the ones the mount
// does not show are skipped by the caller.
std::vector<std::filesystem::path> cgroup_dirs(const std::filesystem::path& base, const std::string& cgroup_path) {
  std::vector<std::filesystem::path> dirs;
  std::filesystem::path p = std::filesystem::path(cgroup_path).relative_path();
  for (;; p = p.parent_path()) {
    dirs.push_back(p.empty() ? base : base / p);
    if (p.empty()) break;
  }
  return dirs;
}

void take_smallest(std::optional<MemoryLimit>& best, const std::filesystem::path& base, const std::string& path,
                   const char* file_name) {
  for (const auto& dir : cgroup_dirs(base, path)) {
    const auto file = dir / file_name;
    if (!std::filesystem::is_regular_file(file)) continue;
    if (auto bytes = read_limit_file(file); bytes && (!best || *bytes < best->bytes)) best = MemoryLimit{*bytes, file};
  }
}

}  // namespace

std::optional<MemoryLimit> cgroup_memory_limit(const CgroupFiles& cgroup) {
  std::optional<MemoryLimit> best;
  std::istringstream lines(cgroup.self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-id:controllers:path
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string controllers = ",";  // ",memory," matches the controller alone in a list such as "cpu,memory"
    controllers.append(line, a + 1, b - a - 1).append(",");
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers == ",,") take_smallest(best, cgroup.root, path, "memory.max");
    else if (controllers.find(",memory,") != std::string::npos)
      take_smallest(best, cgroup.root / "memory", path, "memory.limit_in_bytes");
  }
  return best;
}

Device resolve_device(const std::string& spec, const std::filesystem::path& meminfo, const CgroupFiles& cgroup) {
  const std::string name = lower(spec);
  for (const Device& d : device_presets())
    if (d.name == name) return d;
  if (name == "cpu") {
    const uint64_t ram = meminfo_total_bytes(read_file(meminfo), meminfo.string());
    const auto limit = cgroup_memory_limit(cgroup);
    if (limit && limit->bytes < ram)
      return {"cpu", limit->bytes, false,
              fmt::format("the container's memory limit, {} in {}, below this machine's MemTotal {}",
                          format_bytes(static_cast<double>(limit->bytes)), limit->file.string(),
                          format_bytes(static_cast<double>(ram)))};
    return {"cpu", ram, false, "MemTotal of this machine; no cgroup memory limit below it"};
  }
  if (uint64_t bytes = parse_device_size(spec)) return {spec, bytes, true, "custom size, planned as an accelerator"};
  std::vector<std::string> names;
  for (const Device& d : device_presets()) names.push_back(fmt::format("{} ({})", d.name, format_bytes(d.bytes)));
  throw Error(fmt::format("unknown device '{}'; expected one of {}, cpu (this machine's RAM), or a size such as 48G",
                          spec, fmt::join(names, ", ")));
}

uint64_t parse_byte_size(const std::string& text, std::string_view what) {
  if (uint64_t bytes = parse_device_size(text)) return bytes;
  throw Error(fmt::format("{} '{}': expected a size such as 512M, 4G or 1.5GiB", what, text));
}

uint64_t default_kv_budget(const MemoryPlan& plan, int64_t sequences, int64_t context) {
  return std::min(uint64_t(sequences) * plan.kv_bytes_for_context(context), plan.kv_available / 2);
}

ContextChoice choose_max_model_len(const Gemma4TextConfig& text, const KvLayout& layout, uint64_t kv_budget,
                                   int64_t sequences) {
  const int64_t model_max = text.max_position_embeddings_or(kDefaultContext);
  const KvPoolSize pool = kv_pool_for_budget(layout, kv_budget, sequences, model_max);
  const int64_t held = kv_pool_max_positions(layout, pool);
  const uint64_t full_block = layout.block_bytes(KvClass::Full), sliding_block = layout.block_bytes(KvClass::Sliding);
  if (held < layout.block_size)
    throw Error(fmt::format(
        "a KV pool of {} bytes holds no block of a sequence: a block of {} positions takes {} bytes for the "
        "full-attention layers ({} KV), and the sliding-window layers' windows for {} sequences take {} bytes; give "
        "more memory (--kv-memory, a larger device), fewer sequences (--max-running) or --kv-dtype int8",
        kv_budget, layout.block_size, full_block, kv_dtype_name(layout.dtype), sequences,
        uint64_t(pool.blocks[size_t(KvClass::Sliding)]) * sliding_block));
  ContextChoice choice;
  choice.kv_budget = kv_budget;
  choice.tokens = std::min(model_max, held);
  const std::string model_context = text.max_position_embeddings > 0
                                        ? fmt::format("the model's context (max_position_embeddings {})", model_max)
                                        : fmt::format("{} tokens (config.json states no max_position_embeddings)", model_max);
  if (choice.tokens == model_max) {
    choice.reason = fmt::format("{}: the KV pool of {} holds it", model_context, format_bytes(double(kv_budget)));
    return choice;
  }
  choice.reason = fmt::format(
      "all that the KV pool of {} holds for one sequence, below {}: {} blocks of {} positions for the full-attention "
      "layers ({} B/token, {} KV) after the sliding-window layers' windows for {} sequences ({})",
      format_bytes(double(kv_budget)), model_context, pool.blocks[size_t(KvClass::Full)], layout.block_size,
      full_block / layout.block_size, kv_dtype_name(layout.dtype), sequences,
      format_bytes(double(uint64_t(pool.blocks[size_t(KvClass::Sliding)]) * sliding_block)));
  return choice;
}

ContextChoice choose_max_model_len(const MemoryPlan& plan, const Gemma4TextConfig& text, int64_t sequences) {
  const uint64_t budget = default_kv_budget(plan, sequences, text.max_position_embeddings_or(kDefaultContext));
  if (budget == 0)
    throw Error(fmt::format("the memory plan for {} ({} bytes: {}) leaves nothing for the KV cache: weights {} and "
                            "runtime reserve {} bytes; give --kv-memory or a larger device",
                            plan.device.name, plan.device.bytes, plan.device.note, plan.weights.held(),
                            plan.reserve.total()));
  return choose_max_model_len(text, kv_layout_for_config(text, plan.kv_dtype, 16, text.sliding_window), budget,
                              sequences);
}

uint64_t KvPerToken::bytes_for_context(int64_t n) const {
  if (n < 0) throw Error(fmt::format("context length {}: expected a non-negative number of tokens", n));
  return full_bytes * uint64_t(n) + sliding_bytes * uint64_t(std::min(n, window));
}

KvPerToken kv_per_token(const Gemma4TextConfig& c, KvDtype dtype) {
  KvPerToken kv;
  kv.window = c.sliding_window;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_kv_shared(l)) {  // reads the cache of kv_source(l), owns none
      ++kv.shared_layers;
      continue;
    }
    // K and V. On attention_k_eq_v full layers V is the raw k projection, but transformers (and this engine)
    // still cache V as its own tensor (V gets a weightless RMSNorm and no RoPE, so it differs from cached K).
    const uint64_t bytes = 2 * kv_row_bytes(dtype, c.layer_kv_heads(l), c.layer_head_dim(l));
    if (c.is_full(l)) {
      ++kv.full_layers;
      kv.full_bytes += bytes;
    } else {
      ++kv.sliding_layers;
      kv.sliding_bytes += bytes;
    }
  }
  return kv;
}

uint64_t vision_image_activation_bytes(const Gemma4VisionConfig& v, int64_t soft_tokens) {
  const int64_t budget = soft_tokens > 0 ? soft_tokens : v.soft_tokens_per_image;
  const int64_t patches = budget * v.pooling_kernel_size * v.pooling_kernel_size;
  const int64_t attention = (2 * v.num_attention_heads + 2 * v.num_key_value_heads) * v.head_dim;
  const int64_t clamped = v.use_clipped_linears ? 3 * std::max(v.hidden_size, v.intermediate_size) : 0;
  const int64_t width = v.patch_values() + 3 * v.hidden_size + attention + 2 * v.intermediate_size + clamped;
  return uint64_t(patches) * width * 4;
}

// gemma4_unified's embedders on one item, in f32: an image at its budget of merged patches (the processor's default
// 280, or the largest allowed) (its pixels twice, the patch embedding three times, the soft tokens), a planned
// clip's 25 frames a second (the frames twice and the soft tokens).
uint64_t unified_image_activation_bytes(const Gemma4UnifiedVisionConfig& v, int64_t text_hidden, int64_t soft_tokens) {
  return uint64_t(soft_tokens > 0 ? soft_tokens : 280) * (2 * v.patch_values() + 3 * v.mm_embed_dim + text_hidden) * 4;
}
uint64_t unified_audio_activation_bytes(const Gemma4UnifiedAudioConfig& a, int64_t text_hidden) {
  return uint64_t(kPlannedClipSeconds) * 25 * (2 * a.audio_embed_dim + text_hidden) * 4;
}

uint64_t lora_adapter_bytes(const ModelConfig& config, int64_t rank) {
  uint64_t values = 0;
  for (const ArchTensor& a : gemma4_text_tensors(config))
    if (a.role == TensorRole::Linear || a.role == TensorRole::RouterLinear)
      values += uint64_t(rank) * uint64_t(a.shape[0] + a.shape[1]);
    else if (a.role == TensorRole::FusedExperts)  // [E, out, in]: A [E * rank, in], B [out, rank * E]
      values += uint64_t(rank) * uint64_t(a.shape[0]) * uint64_t(a.shape[1] + a.shape[2]);
  for (const ArchTensor& a : gemma4_tower_tensors(config))
    if (a.role == TensorRole::Linear) values += uint64_t(rank) * uint64_t(a.shape[0] + a.shape[1]);
  // The 12B's encoder-free embedders: patch_dense and the two embedding projections.
  const uint64_t hidden = uint64_t(config.text.hidden_size);
  if (const auto& v = config.unified_vision)
    values += uint64_t(rank) * (uint64_t(v->patch_values() + v->mm_embed_dim) + hidden + uint64_t(v->mm_embed_dim));
  if (const auto& a = config.unified_audio) values += uint64_t(rank) * (hidden + uint64_t(a->audio_embed_dim));
  return values * sizeof(float);
}

RuntimeReserve runtime_reserve(const ModelConfig& config, const PlanOptions& o) {
  const Gemma4TextConfig& c = config.text;
  int64_t ffn = 0, kv_values = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ffn = std::max(ffn, c.layer_intermediate(l));
    if (!c.is_kv_shared(l)) kv_values += 2 * c.layer_kv_heads(l) * c.layer_head_dim(l);
  }
  const int64_t H = c.hidden_size, q = c.num_attention_heads * std::max(c.head_dim, c.global_head_dim);
  const int64_t ple = c.num_hidden_layers * c.hidden_size_per_layer_input;
  // The forward pass's scratch (model/gemma4.cc, Scratch), per row of a step, in f32; every buffer keeps the size
  // of the largest step it served. The residual, normed input and FFN output (3 x hidden); two temporaries as wide
  // as the widest of gate/up, the o_proj output and the per-layer projection; the queries and the attention output
  // before o_proj (heads x head_dim each); the per-layer-embedding inputs; this call's fresh K/V of every owning
  // layer; and the linear kernels' packed copy of their widest input.
  int64_t packed = std::max({H, q, ffn});
  uint64_t width = 3 * H + 2 * std::max(ffn, H) + 2 * q + ple + kv_values;
  if (c.enable_moe_block) {
    // The experts beside the dense MLP: router input, normed input and output (3 x hidden), router logits, and
    // every routed (row, expert) pair's input, gate, up and down rows (top_k x (2 x hidden + 2 x expert width)).
    const int64_t K = c.top_k_experts, I = c.moe_intermediate_size;
    width += 3 * H + c.num_experts + 2 * K * (H + I);
    packed = std::max({packed, K * H, K * I});
  }
  width += (packed + 31) / 32 * 32;  // packed a group of 32 columns at a time
  // A bf16 or int8 cache also gets this call's K/V as the cache stores them (what attention reads for them): the
  // per-token KV bytes of the owning layers, per row.
  const KvPerToken kv = kv_per_token(c, o.kv_dtype);
  const uint64_t coded = o.kv_dtype == KvDtype::F32 ? 0 : kv.full_bytes + kv.sliding_bytes;
  // A step runs one prefill chunk beside a token of every other running sequence.
  const uint64_t rows = uint64_t(o.prefill_chunk) + uint64_t(o.batch);
  RuntimeReserve r;
  r.activations = rows * (width * 4 + coded);
  r.logits = uint64_t(o.batch) * c.vocab_size * 4;
  r.fixed = kFixedReserve;
  r.accelerator = o.device.accelerator ? kAcceleratorReserve : 0;
  if (config.vision) r.image = vision_image_activation_bytes(*config.vision, o.image_soft_tokens);
  if (config.unified_vision)
    r.image = unified_image_activation_bytes(*config.unified_vision, c.hidden_size, o.image_soft_tokens);
  if (config.unified_audio) r.audio = unified_audio_activation_bytes(*config.unified_audio, c.hidden_size);
  if (config.has_audio && !config.is_unified())
    r.audio = audio_tower_plan(parse_audio_config(config, "config.json"), c.hidden_size, WeightFormat::Bf16,
                               kPlannedClipSeconds * kAudioFramesPerSecond).activations;
  r.adapters = o.adapter_bytes;
  return r;
}

int64_t MemoryPlan::contexts_that_fit(int64_t context_len) const {
  if (context_len <= 0) throw Error(fmt::format("context length {}: expected a positive number of tokens", context_len));
  return weights_fit ? static_cast<int64_t>(kv_available / kv.bytes_for_context(context_len)) : 0;
}

int64_t MemoryPlan::longest_context() const {
  if (!weights_fit) return 0;
  const uint64_t per_token = kv.full_bytes + kv.sliding_bytes, up_to_window = per_token * kv.window;
  if (per_token == 0) return std::numeric_limits<int64_t>::max();
  if (kv_available < up_to_window) return static_cast<int64_t>(kv_available / per_token);
  if (kv.full_bytes == 0) return std::numeric_limits<int64_t>::max();  // only windowed layers: bounded KV
  return kv.window + static_cast<int64_t>((kv_available - up_to_window) / kv.full_bytes);
}

MemoryPlan plan_memory(const ModelConfig& config, const WeightBytes& weights, const PlanOptions& options) {
  if (options.prefill_chunk <= 0 || options.batch <= 0)
    throw Error(fmt::format("plan options: prefill_chunk {} and batch {} must be positive", options.prefill_chunk,
                            options.batch));
  MemoryPlan p;
  p.device = options.device;
  p.kv_dtype = options.kv_dtype;
  p.weights = weights;
  p.reserve = runtime_reserve(config, options);
  p.kv = kv_per_token(config.text, options.kv_dtype);
  p.max_position_embeddings = config.text.max_position_embeddings;
  const uint64_t needed = weights.held() + p.reserve.total();
  p.weights_fit = needed <= p.device.bytes;
  p.kv_available = p.weights_fit ? p.device.bytes - needed : 0;
  return p;
}

std::string format_memory_plan(const MemoryPlan& p, int64_t n, const std::string& model_label,
                               const ContextChoice* choice) {
  auto B = [](uint64_t b) { return format_bytes(static_cast<double>(b)); };
  std::string s = fmt::format("memory plan: {}, {}\ndevice: {}, {} ({})\n\n", model_label, p.weights.source,
                              p.device.name, B(p.device.bytes), p.device.note);
  s += "weights (text decoder)\n";
  for (size_t i = 0; i < kWeightClasses; ++i)
    s += fmt::format("  {:<28}{:>12}\n", weight_class_name(static_cast<WeightClass>(i)), B(p.weights.by_class[i]));
  s += fmt::format("  {:<28}{:>12}   (the tied LM head is the embedding, counted once)\n", "total", B(p.weights.total()));
  if (p.weights.lm_head_int4)
    s += fmt::format("  {:<28}{:>12}   (the LM head: the tied embedding repacked losslessly, on the QAT grid)\n",
                     "int4 LM head", B(p.weights.lm_head_int4));
  if (p.weights.gathered_by_row)
    s += fmt::format("  of which read a row per token: {} ({}; on the cpu resident only for tokens in use)\n",
                     B(p.weights.gathered_by_row),
                     p.weights.lm_head_int4 ? "the per-layer embedding and embedding tables" : "per-layer embedding table");
  if (p.weights.towers) s += fmt::format("  {:<28}{:>12}   (held beside the text decoder)\n", "vision/audio towers", B(p.weights.towers));
  if (p.weights.unused) s += fmt::format("  not loaded: {} (lm_head copy, KV-shared k/v, unknown tensors)\n", B(p.weights.unused));

  const RuntimeReserve& r = p.reserve;
  s += fmt::format("\nruntime reserve{:>29}\n", B(r.total()));
  s += fmt::format("  {:<28}{:>12}\n", "activations (prefill chunk)", B(r.activations));
  if (r.image) s += fmt::format("  {:<28}{:>12}\n", "vision tower (one image)", B(r.image));
  if (r.audio) s += fmt::format("  {:<28}{:>12}\n", fmt::format("audio tower (one {} s clip)", kPlannedClipSeconds),
                                B(r.audio));
  if (r.image && r.audio) s += "  (media items are encoded one at a time: the larger of the two is reserved)\n";
  s += fmt::format("  {:<28}{:>12}\n", "logits (batch x vocab x 4)", B(r.logits));
  if (r.adapters) s += fmt::format("  {:<28}{:>12}   (A and B in f32)\n", "LoRA adapters", B(r.adapters));
  s += fmt::format("  {:<28}{:>12}\n", "fixed allowance", B(r.fixed));
  if (r.accelerator) s += fmt::format("  {:<28}{:>12}\n", "accelerator context", B(r.accelerator));

  const KvPerToken& kv = p.kv;
  const int64_t owning = kv.sliding_layers + kv.full_layers;
  s += fmt::format("\nKV cache ({}), per token: {}\n", kv_dtype_name(p.kv_dtype),
                   kv.shared_layers ? fmt::format("{} of {} layers own a cache, the {} KV-shared ones read their donor's",
                                                  owning, owning + kv.shared_layers, kv.shared_layers)
                                    : fmt::format("all {} layers own a cache", owning));
  s += fmt::format("  sliding {:>3} layers {:>12} B/token   bounded: at most {} tokens, {} a sequence\n",
                   kv.sliding_layers, with_commas(kv.sliding_bytes), kv.window, B(kv.sliding_bytes * kv.window));
  s += fmt::format("  full    {:>3} layers {:>12} B/token   grows with the context\n", kv.full_layers,
                   with_commas(kv.full_bytes));
  s += fmt::format("  one {}-token context: {} x {} + {} x {} = {}\n", n, with_commas(kv.full_bytes), n,
                   with_commas(kv.sliding_bytes), std::min(n, kv.window), B(kv.bytes_for_context(n)));

  const uint64_t needed = p.weights.held() + r.total();
  s += fmt::format("\n{:<30}{:>12}\n", "device", B(p.device.bytes));
  s += fmt::format("{:<30}{:>12}\n", "- weights - runtime reserve", B(needed));
  if (!p.weights_fit) {
    s += fmt::format("DOES NOT FIT: weights {} + reserve {} = {} exceed the device's {} by {}\n", B(p.weights.held()),
                     B(r.total()), B(needed), B(p.device.bytes), B(needed - p.device.bytes));
    return s;
  }
  s += fmt::format("{:<30}{:>12}\n", "= available for KV", B(p.kv_available));
  if (!p.device.accelerator)
    s += fmt::format("resident on the cpu besides KV: {} (weights but the row-read table, and the reserve)\n",
                     B(p.cpu_resident_without_kv()));
  const int64_t fit = p.contexts_that_fit(n), longest = p.longest_context();
  s += fmt::format("contexts of {} tokens that fit: {}\n", n, fit);
  s += fmt::format("longest single context: {} tokens (model maximum {})\n",
                   longest == std::numeric_limits<int64_t>::max() ? std::string("unbounded") : with_commas(longest),
                   p.max_position_embeddings ? with_commas(p.max_position_embeddings) : std::string("not stated"));
  if (p.max_position_embeddings && n > p.max_position_embeddings)
    s += fmt::format("note: {} tokens is beyond the model's max_position_embeddings {}\n", n, p.max_position_embeddings);
  if (choice) s += fmt::format("max-model-len serve chooses: {} tokens ({})\n", with_commas(choice->tokens), choice->reason);
  if (fit == 0)
    s += fmt::format("DOES NOT FIT: one {}-token context needs {} of KV, {} is available\n", n,
                     B(kv.bytes_for_context(n)), B(p.kv_available));
  return s;
}

nlohmann::ordered_json memory_plan_json(const MemoryPlan& p, int64_t n, const std::string& model_label,
                                        const ContextChoice* choice) {
  nlohmann::ordered_json weights = nlohmann::ordered_json::object();
  for (size_t i = 0; i < kWeightClasses; ++i)
    weights[std::string(weight_class_name(static_cast<WeightClass>(i)))] = p.weights.by_class[i];
  weights["total"] = p.weights.total();
  weights["towers"] = p.weights.towers;
  weights["not_loaded"] = p.weights.unused;
  weights["gathered_by_row"] = p.weights.gathered_by_row;
  weights["lm_head_int4"] = p.weights.lm_head_int4;
  const RuntimeReserve& r = p.reserve;
  const KvPerToken& kv = p.kv;
  const int64_t longest = p.longest_context();
  nlohmann::ordered_json j = {{"model", model_label},
          {"weights_source", p.weights.source},
          {"device", {{"name", p.device.name}, {"bytes", p.device.bytes}, {"accelerator", p.device.accelerator},
                      {"note", p.device.note}}},
          {"weights", weights},
          {"runtime_reserve", {{"activations", r.activations}, {"logits", r.logits}, {"fixed", r.fixed},
                               {"accelerator", r.accelerator}, {"image", r.image}, {"audio", r.audio}, {"adapters", r.adapters},
                               {"total", r.total()}}},
          {"kv", {{"dtype", kv_dtype_name(p.kv_dtype)}, {"sliding_layers", kv.sliding_layers},
                  {"full_layers", kv.full_layers}, {"shared_layers", kv.shared_layers}, {"window", kv.window},
                  {"sliding_bytes_per_token", kv.sliding_bytes}, {"full_bytes_per_token", kv.full_bytes},
                  {"sliding_bytes_max", kv.sliding_bytes * kv.window}, {"bytes_for_context", kv.bytes_for_context(n)}}},
          {"fits", p.weights_fit && p.contexts_that_fit(n) > 0},
          {"weights_fit", p.weights_fit},
          {"available_for_kv", p.kv_available},
          {"cpu_resident_without_kv", p.cpu_resident_without_kv()},
          {"context", n},
          {"contexts_that_fit", p.contexts_that_fit(n)},
          {"longest_context", longest == std::numeric_limits<int64_t>::max() ? nlohmann::ordered_json(nullptr)
                                                                            : nlohmann::ordered_json(longest)},
          {"max_position_embeddings", p.max_position_embeddings}};
  if (choice)
    j["max_model_len"] = {{"tokens", choice->tokens}, {"kv_budget", choice->kv_budget}, {"reason", choice->reason}};
  return j;
}

}  // namespace qs
