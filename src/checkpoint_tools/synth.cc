#include "checkpoint_tools/synth.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "checkpoint_tools/float_linears.h"
#include "checkpoint_tools/presets.h"
#include "checkpoint_tools/tensor_stream.h"
#include "formats/dtype.h"
#include "media/image_processor.h"
#include "model/gemma4_tensors.h"
#include "model/gemma4_tower_tensors.h"
#include "quant/qat_grid.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/file.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: counter-based, so any row can be generated alone
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix(seed ^ h);
}

float unit(uint64_t h) { return static_cast<float>(h >> 40) / static_cast<float>(1ull << 24); }

// Values on the QAT grid for a 2-D view [rows, cols] of a source tensor. Groups of 32 along cols.
struct GridValues {
  uint64_t key;
  int64_t cols;
  float base_step;

  // bf16 step of a group, 0 for an all-zero group; peak is the largest |level| the group may use.
  uint16_t step(int64_t row, int64_t group, int& peak) const {
    static constexpr int kPeaks[8] = {8, 8, 8, 7, 7, 6, 5, 3};
    uint64_t h = mix(key ^ mix(static_cast<uint64_t>(row) * 0x10001ull + static_cast<uint64_t>(group)));
    peak = kPeaks[(h >> 9) & 7];
    if ((h & 511) == 0) return 0;
    return f32_to_bf16(base_step * std::exp2(unit(h) - 0.5f));
  }
  int8_t level(int64_t row, int64_t col, int peak) const {
    uint64_t h = mix(key + static_cast<uint64_t>(row * cols + col) * 0x9e3779b97f4a7c15ull);
    int hi = std::min(peak, 7);
    return static_cast<int8_t>(static_cast<int>(h % static_cast<uint64_t>(hi + peak + 1)) - peak);
  }
  // Levels and step of one group.
  uint16_t group(int64_t row, int64_t g, int8_t* levels) const {
    int peak;
    uint16_t s = step(row, g, peak);
    for (int i = 0; i < kQatGroupSize; ++i) levels[i] = s ? level(row, g * kQatGroupSize + i, peak) : 0;
    return s;
  }
  void bf16_row(int64_t row, uint16_t* out) const {
    int8_t lv[kQatGroupSize];
    for (int64_t g = 0; g < cols / kQatGroupSize; ++g) {
      float s = bf16_to_f32(group(row, g, lv));
      for (int i = 0; i < kQatGroupSize; ++i) out[g * kQatGroupSize + i] = f32_to_bf16(lv[i] * s);
    }
  }
};

struct Synth {
  const SynthOptions& opt;
  const ModelConfig& config;
  std::vector<OutputTensor> outputs;

  uint64_t key(const std::string& name) const { return name_key(opt.seed, name); }

  GridValues grid(const std::string& source_name, int64_t cols) const {
    return {key(source_name), cols, 1.0f / (6.0f * std::sqrt(static_cast<float>(cols)))};
  }

  bool wanted(const std::string& name) const { return name != opt.fault_missing; }

  // bf16 values of a source tensor seen as [rows, cols], rows [row_offset, row_offset + rows) of it.
  void add_bf16_grid(const std::string& name, std::vector<int64_t> shape, const std::string& source,
                     int64_t row_offset = 0) {
    if (!wanted(name)) return;
    int64_t cols = shape.back(), rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    GridValues gv = grid(source, cols);
    bool off_grid = name == opt.fault_off_grid;
    OutputTensor t{{name, DType::BF16, shape}, rows};
    t.fill = [gv, cols, row_offset, off_grid](int64_t r0, int64_t r1, std::byte* out) {
      auto* p = reinterpret_cast<uint16_t*>(out);
      for (int64_t r = r0; r < r1; ++r) gv.bf16_row(row_offset + r, p + (r - r0) * cols);
      if (off_grid && r0 == 0) {  // peak 7 steps, then a value no grid of 32 can hold: 2.7183 steps
        int peak;
        float s = bf16_to_f32(gv.step(row_offset, 0, peak));
        if (s == 0) s = gv.base_step;
        p[0] = f32_to_bf16(7 * s);
        p[1] = f32_to_bf16(2.7183f * s);
      }
    };
    outputs.push_back(std::move(t));
  }

  // weight_packed / weight_scale / weight_shape of a module whose values come from `source` rows.
  void add_w4a16(const std::string& module, int64_t out_features, int64_t in_features, const std::string& source,
                 int64_t row_offset = 0) {
    if (!wanted(module + ".weight_packed")) return;
    GridValues gv = grid(source, in_features);
    int64_t groups = in_features / kQatGroupSize, words = in_features / kLevelsPerWord;
    OutputTensor packed{{module + ".weight_packed", DType::I32, {out_features, words}}, out_features};
    packed.fill = [gv, groups, words, row_offset](int64_t r0, int64_t r1, std::byte* out) {
      std::vector<int8_t> lv(groups * kQatGroupSize);
      auto* w = reinterpret_cast<uint32_t*>(out);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t g = 0; g < groups; ++g) gv.group(row_offset + r, g, lv.data() + g * kQatGroupSize);
        pack_int4(lv, {w + (r - r0) * words, static_cast<size_t>(words)});
      }
    };
    OutputTensor scale{{module + ".weight_scale", DType::BF16, {out_features, groups}, 4}, out_features};
    scale.fill = [gv, groups, row_offset](int64_t r0, int64_t r1, std::byte* out) {
      auto* s = reinterpret_cast<uint16_t*>(out);
      int peak;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t g = 0; g < groups; ++g) s[(r - r0) * groups + g] = gv.step(row_offset + r, g, peak);
    };
    outputs.push_back(std::move(packed));
    outputs.push_back(std::move(scale));
    outputs.push_back(shape_tensor(module, out_features, in_features));
  }

  static OutputTensor shape_tensor(const std::string& module, int64_t out_features, int64_t in_features) {
    std::vector<std::byte> bytes(16);
    std::memcpy(bytes.data(), &out_features, 8);
    std::memcpy(bytes.data() + 8, &in_features, 8);
    return constant_tensor({module + ".weight_shape", DType::I64, {2}}, std::move(bytes));
  }

  // Norm weights near 1, layer scalars in (0.2, 0.8), router scales near 1, tower weights off any grid.
  void add_random(const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    if (!wanted(name)) return;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    int64_t rows = shape.size() >= 2 ? shape[0] : 1, cols = numel / std::max<int64_t>(rows, 1);
    uint64_t k = key(name);
    OutputTensor t{{name, DType::BF16, std::move(shape)}, rows};
    t.fill = [k, cols, center, spread](int64_t r0, int64_t r1, std::byte* out) {
      auto* p = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = r0 * cols; i < r1 * cols; ++i)
        p[i - r0 * cols] = f32_to_bf16(center + spread * (unit(mix(k + static_cast<uint64_t>(i))) - 0.5f));
    };
    outputs.push_back(std::move(t));
  }

  void add_experts(const ArchTensor& a) {
    int64_t E = a.shape[0], R = a.shape[1], C = a.shape[2];
    std::string layer = a.name.substr(0, a.name.find("experts."));
    bool gate_up = a.name.ends_with("gate_up_proj");
    for (int64_t e = 0; e < E; ++e) {
      if (gate_up) {
        add_w4a16(expert_module(layer, e, "gate_proj"), R / 2, C, a.name, e * R);
        add_w4a16(expert_module(layer, e, "up_proj"), R / 2, C, a.name, e * R + R / 2);
      } else {
        add_w4a16(expert_module(layer, e, "down_proj"), R, C, a.name, e * R);
      }
    }
  }

  void add_arch_tensor(const ArchTensor& a) {
    bool packed = opt.format == CheckpointFormat::W4A16 && a.quantized_in_w4a16;
    switch (a.role) {
      case TensorRole::Norm: return add_random(a.name, a.shape, 1.0f, 0.25f);
      case TensorRole::LayerScalar: return add_random(a.name, a.shape, 0.5f, 0.6f);
      case TensorRole::RouterVector: return add_random(a.name, a.shape, 1.0f, 0.5f);
      case TensorRole::FusedExperts:
        return packed ? add_experts(a) : add_bf16_grid(a.name, a.shape, a.name);
      case TensorRole::Linear:
        if (packed) return add_w4a16(a.module, a.shape[0], a.shape[1], a.name);
        [[fallthrough]];
      default: return add_bf16_grid(a.name, a.shape, a.name);
    }
  }

  // Tower tensors: linears on the grid (packed in w4a16 but where the export keeps them bf16), norms near 1, clip
  // bounds around -+10 (finite, so the clamps run, rarely binding), standardization scales near 1, the rest small.
  void add_tower_tensor(const ArchTensor& a) {
    const bool packed = opt.format == CheckpointFormat::W4A16 && a.quantized_in_w4a16 && !opt.towers_bf16 &&
                        a.shape[1] % kQatGroupSize == 0;
    switch (a.role) {
      case TensorRole::Linear:
        return packed ? add_w4a16(a.module, a.shape[0], a.shape[1], a.name) : add_bf16_grid(a.name, a.shape, a.name);
      case TensorRole::Norm: return add_random(a.name, a.shape, 1.0f, 0.25f);
      case TensorRole::ClipBound: return add_random(a.name, a.shape, a.name.ends_with("_min") ? -10.0f : 10.0f, 4.0f);
      default: return add_random(a.name, a.shape, a.name.ends_with("std_scale") ? 1.0f : 0.0f, 0.2f);
    }
  }

  // gemma4_unified's encoder-free embedders, named and shaped as Google's files store them (bf16: on `ignore`).
  void add_unified_embedders() {
    int64_t H = config.text.hidden_size;
    if (config.unified_vision) {
      const int64_t E = config.unified_vision->mm_embed_dim, P = config.unified_vision->patch_values();
      const std::string v = "model.vision_embedder.";
      for (const auto& [norm, n] : {std::pair{"patch_ln1", P}, {"patch_ln2", E}, {"pos_norm", E}}) {
        add_random(v + norm + ".weight", {n}, 1.0f, 0.1f);
        add_random(v + norm + ".bias", {n}, 0.0f, 0.1f);
      }
      add_random(v + "patch_dense.weight", {E, P}, 0.0f, 0.02f);
      add_random(v + "patch_dense.bias", {E}, 0.0f, 0.1f);
      add_random(v + "pos_embedding", {config.unified_vision->mm_posemb_size, 2, E}, 0.0f, 0.1f);
      add_random("model.embed_vision.embedding_projection.weight", {H, E}, 0.0f, 0.1f);
    }
    if (config.unified_audio)
      add_random("model.embed_audio.embedding_projection.weight", {H, config.unified_audio->audio_embed_dim}, 0.0f,
                 0.1f);
  }

  // An assistant drafter's own linears (the projections to and from the target's width, the ordered-embeddings
  // head's centroids) are architecture tensors (gemma4_text_tensors); what is left is that head's permutation of
  // the vocabulary (token_ordering, I64 as transformers saves it).
  void add_assistant_token_ordering() {
    if (!config.assistant->use_ordered_embeddings) return;
    const int64_t V = config.text.vocab_size;
    std::vector<int64_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    const uint64_t k = key("masked_embedding.token_ordering");
    for (int64_t i = V - 1; i > 0; --i)  // Fisher-Yates on the counter hash: the same on every platform
      std::swap(order[i], order[mix(k + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1)]);
    std::vector<std::byte> bytes(V * sizeof(int64_t));
    std::memcpy(bytes.data(), order.data(), bytes.size());
    outputs.push_back(constant_tensor({"masked_embedding.token_ordering", DType::I64, {V}}, std::move(bytes)));
  }

  std::vector<std::string> ignore_list() const {
    std::vector<std::string> ignore = {"lm_head"};  // always: the tied head must never be expected packed
    for (const auto& t : outputs)
      if (t.spec.name != "lm_head.weight" && t.spec.dtype == DType::BF16 &&
          (is_float_linear_weight(t.spec.name, t.spec.shape) ||
                                          t.spec.name.find("router.proj") != std::string::npos))
        ignore.push_back(module_of(t.spec.name));
    return ignore;
  }
};

ModelConfig load_synth_config(const SynthOptions& opt, std::string& text) {
  if (!opt.preset.empty() && !opt.config_file.empty()) throw Error("synth: give --preset or --config, not both");
  if (!opt.preset.empty()) {
    text = preset_config_text(opt.preset);
    return parse_model_config(text, "preset " + opt.preset);
  }
  if (opt.config_file.empty()) throw Error("synth: --preset NAME or --config FILE is required");
  text = read_file(opt.config_file);
  return parse_model_config(text, opt.config_file.string());
}

void check_quantizable(const ModelConfig& config) {
  for (const auto& a : gemma4_text_tensors(config))
    if (a.quantized_in_w4a16 && a.shape.back() % kQatGroupSize != 0)
      throw Error(fmt::format("synth: tensor '{}' has {} input columns, not a multiple of the QAT group size {}",
                              a.name, a.shape.back(), kQatGroupSize));
}

// The image processor's settings for the vision tower: Gemma4ImageProcessor's defaults at the tower's patch and
// pooling sizes and the wrapper's budget. Converters (llama.cpp's --mmproj) read image_mean/image_std from it.
std::string processor_config(const Gemma4VisionConfig& v) {
  media::ImageProcessorOptions o;
  o.patch_size = int(v.patch_size);
  o.pooling_kernel_size = int(v.pooling_kernel_size);
  o.max_soft_tokens = int(v.soft_tokens_per_image);
  return media::processor_config_json(o);
}

std::string generation_config(const Gemma4TextConfig& t) {
  nlohmann::ordered_json g = {{"bos_token_id", t.bos_token_id}, {"pad_token_id", t.pad_token_id},
                              {"eos_token_id", {1, 106, 50}},   {"do_sample", true},
                              {"temperature", 1.0},             {"top_k", 64},
                              {"top_p", 0.95}};
  return g.dump(2) + "\n";
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : preset_configs()) names.emplace_back(p.name);
  return names;
}

std::string preset_config_text(const std::string& name) {
  for (const auto& p : preset_configs())
    if (p.name == name) return std::string(p.json);
  throw Error(fmt::format("unknown preset '{}'; presets: {}", name, fmt::join(synth_preset_names(), ", ")));
}

SynthResult synth_checkpoint(const SynthOptions& opt) {
  std::string config_text;
  ModelConfig config = load_synth_config(opt, config_text);
  check_quantizable(config);
  Synth s{opt, config, {}};
  if (!opt.towers_only)
    for (const auto& a : gemma4_text_tensors(config)) s.add_arch_tensor(a);
  if (config.assistant) s.add_assistant_token_ordering();
  const bool writes_towers = opt.towers_only || opt.towers.value_or(config.has_vision || config.has_audio);
  if (writes_towers) {
    if (config.is_unified()) s.add_unified_embedders();  // the 12B's encoder-free embedders (no towers)
    for (const auto& a : gemma4_tower_tensors(config)) s.add_tower_tensor(a);
  }
  if (s.outputs.empty()) throw Error("synth: --towers-only, but the config describes no vision or audio tower");
  nlohmann::ordered_json cfg = config.raw;
  // Google's w4a16 exports carry a byte copy of the tied embedding as lm_head.
  // (Assistants' exports have none: the fixtures transformers saves.)
  if (!opt.towers_only && opt.lm_head.value_or(opt.format == CheckpointFormat::W4A16 && !config.assistant)) {
    auto emb = gemma4_text_tensors(config).front();
    s.add_bf16_grid("lm_head.weight", emb.shape, emb.name);
  }
  if (opt.format == CheckpointFormat::W4A16)
    cfg["quantization_config"] = w4a16_quantization_config(s.ignore_list(), kQatGroupSize);

  CheckpointWriter writer(opt.out, specs_of(s.outputs), opt.max_shard_bytes);
  uint64_t total = 0;
  for (auto& t : s.outputs) total += t.source_bytes = t.spec.nbytes();
  Progress progress("synth " + opt.out.filename().string(), total, opt.progress);
  stream_tensors(writer, s.outputs, progress);
  writer.write_file("config.json", cfg.dump(2) + "\n");
  writer.write_file("generation_config.json", generation_config(config.text));
  if (writes_towers && config.vision) writer.write_file("processor_config.json", processor_config(*config.vision));
  if (opt.tokenizer_dir) {
    if (!fs::is_directory(*opt.tokenizer_dir))
      throw Error(fmt::format("{}: tokenizer directory does not exist", opt.tokenizer_dir->string()));
    for (const auto& e : fs::directory_iterator(*opt.tokenizer_dir))
      if (e.is_regular_file()) writer.copy_file(e.path(), e.path().filename().string());
  }
  size_t shards = writer.shard_count();
  writer.commit();
  progress.finish();
  if (opt.fault_truncate) {
    fs::path last = shards == 1 ? opt.out / "model.safetensors"
                                : opt.out / fmt::format("model-{:05d}-of-{:05d}.safetensors", shards, shards);
    fs::resize_file(last, fs::file_size(last) - std::min<uintmax_t>(fs::file_size(last) / 2, 4096));
  }
  return {s.outputs.size(), total, progress.elapsed_seconds()};
}

}  // namespace qs
