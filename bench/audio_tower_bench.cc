// Encode time of the full-size E2B audio tower (configs/e2b.json's audio_config: subsampling 128 / 32 channels, 12
// conformer layers of hidden 1024, output 1536, embed_audio to the text's 1536) on synthetic weights, bf16
// activations, for clips of 10 s and 30 s (the feature extractor's 100 frames a second: 1000 / 3000 frames, 250 /
// 750 soft tokens), from a w4a16 checkpoint (tower linears int4, as the planner assumes) or a bf16 one. The
// synthetic checkpoint is written once per format into the temporary directory (~170 MB / ~600 MB).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "checkpoint_tools/presets.h"
#include "formats/checkpoint.h"
#include "formats/checkpoint_writer.h"
#include "formats/dtype.h"
#include "formats/model_config.h"
#include "model/gemma4_audio.h"
#include "model/gemma4_tower_tensors.h"
#include "quant/qat_grid.h"

namespace {

namespace fs = std::filesystem;
using qs::DType;

nlohmann::ordered_json e2b_config() {
  for (const qs::PresetConfig& p : qs::preset_configs())
    if (p.name == "e2b") return nlohmann::ordered_json::parse(p.json);
  throw std::runtime_error("no e2b preset");
}

// Seeded values of one tensor as the format stores it: linears ~ 1/sqrt(in) (int4: random levels, that step),
// clip bounds +-100 (finite: the clamps run, nothing is clipped), norms 1, the rest small.
std::vector<std::byte> synthetic(const qs::TensorSpec& spec, std::mt19937& rng) {
  std::vector<std::byte> out(spec.nbytes());
  const size_t n = spec.nbytes() / qs::dtype_size(spec.dtype);
  if (spec.dtype == DType::I32) {
    for (size_t i = 0; i < n; ++i) reinterpret_cast<uint32_t*>(out.data())[i] = static_cast<uint32_t>(rng());
    return out;
  }
  if (spec.dtype == DType::I64) {  // weight_shape
    return out;
  }
  const std::string& name = spec.name;
  const int64_t in = spec.shape.size() > 1 ? spec.shape.back() : 1;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto* values = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < n; ++i) {
    float v = normal(rng) / std::sqrt(static_cast<float>(in));
    if (name.ends_with("_min")) v = -100;
    else if (name.ends_with("_max")) v = 100;
    else if (name.ends_with("norm.weight")) v = 1;
    else if (name.ends_with(".weight_scale")) v = 0.25f / std::sqrt(static_cast<float>(in * qs::kQatGroupSize));
    values[i] = qs::f32_to_bf16(v);
  }
  return out;
}

// The tower's tensors as the format stores them; a w4a16 weight_shape holds [out, in].
std::vector<qs::TensorSpec> tensor_specs(const qs::Gemma4AudioConfig& audio, int64_t text_hidden, bool w4a16,
                                         std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<qs::TensorSpec> specs;
  for (const qs::ArchTensor& t : qs::gemma4_audio_tensors(audio, text_hidden)) {
    if (!(w4a16 && t.quantized_in_w4a16)) {
      specs.push_back({t.name, DType::BF16, t.shape});
      continue;
    }
    const std::string module = t.name.substr(0, t.name.size() - 7);
    const int64_t out = t.shape[0], in = t.shape[1];
    specs.push_back({module + ".weight_packed", DType::I32, {out, in / 8}});
    specs.push_back({module + ".weight_scale", DType::BF16, {out, in / qs::kQatGroupSize}, 4});
    specs.push_back({module + ".weight_shape", DType::I64, {2}});
    shapes[module + ".weight_shape"] = {out, in};
  }
  return specs;
}

fs::path synthetic_tower(bool w4a16) {
  const fs::path dir = fs::temp_directory_path() / (w4a16 ? "qatserve-audio-bench-w4a16" : "qatserve-audio-bench-bf16");
  if (fs::exists(dir / "config.json")) return dir;
  nlohmann::ordered_json config = e2b_config();
  if (w4a16)
    config["quantization_config"] =
        qs::w4a16_quantization_config({"lm_head", "model.embed_audio.embedding_projection"}, qs::kQatGroupSize);
  qs::ModelConfig parsed = qs::parse_model_config(config.dump(), "e2b");
  std::map<std::string, std::vector<int64_t>> shapes;
  qs::CheckpointWriter writer(dir, tensor_specs(qs::parse_audio_config(parsed, "e2b"), parsed.text.hidden_size,
                                                w4a16, shapes));
  std::mt19937 rng(1);
  while (const qs::TensorSpec* spec = writer.current()) {
    std::vector<std::byte> bytes = synthetic(*spec, rng);
    if (auto it = shapes.find(spec->name); it != shapes.end()) std::memcpy(bytes.data(), it->second.data(), 16);
    writer.append(bytes);
  }
  writer.write_file("config.json", config.dump(2) + "\n");
  writer.commit();
  return dir;
}

void BM_AudioTowerEncode(benchmark::State& state) {
  const bool w4a16 = state.range(0) == 1;
  const int64_t seconds = state.range(1), frames = 100 * seconds;
  const fs::path dir = synthetic_tower(w4a16);
  qs::Checkpoint checkpoint = qs::Checkpoint::open(dir);
  auto encoder = qs::Gemma4AudioEncoder::load(checkpoint, qs::read_model_config(dir / "config.json"),
                                              qs::Precision::BF16);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> features(frames * encoder->mel_bins());
  for (float& f : features) f = normal(rng);
  const std::vector<uint8_t> mask(frames, 1);
  int64_t soft_tokens = 0;
  const std::clock_t cpu_start = std::clock();  // the process's CPU time, every thread's
  for (auto _ : state) {
    std::vector<float> out = encoder->encode(features, mask);
    soft_tokens = static_cast<int64_t>(out.size()) / encoder->text_hidden();
    benchmark::DoNotOptimize(out.data());
  }
  // On a shared machine wall time follows the load; CPU seconds of all threads per encode do not (much).
  state.counters["cpu_s_all_threads"] =
      static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / static_cast<double>(state.iterations());
  state.SetLabel(std::string(w4a16 ? "w4a16" : "bf16") + ", " + std::to_string(seconds) + " s clip");
  state.counters["soft_tokens"] = static_cast<double>(soft_tokens);
  state.counters["audio_s_per_s"] =
      benchmark::Counter(static_cast<double>(seconds) * state.iterations(), benchmark::Counter::kIsRate);
}
// Args: {w4a16 (1) or bf16 (0), clip seconds}.
BENCHMARK(BM_AudioTowerEncode)
    ->Args({1, 10})
    ->Args({1, 30})
    ->Args({0, 10})
    ->Args({0, 30})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

}  // namespace
