#include "model/lora_experts.h"

#include <fmt/format.h>

#include <algorithm>

#include "formats/dtype.h"
#include "kernels/ops.h"
#include "model/gemma4.h"
#include "model/lora_config.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {

void ExpertLoraWeights::set_b(const std::vector<float>& lora_b) {
  // lora_B [out, rank * experts]: column k * experts + e is B_e's column k (PEFT: B.reshape(out, r, E)).
  bt.resize(experts * rank * out);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < rank; ++k)
      for (int64_t e = 0; e < experts; ++e) bt[(e * rank + k) * out + o] = lora_b[o * rank * experts + k * experts + e];
}

std::vector<ExpertTarget> expert_targets(const LoraConfig& c, const Gemma4Model& model, const std::string& prefix) {
  std::vector<ExpertTarget> out;
  if (c.target_parameters.empty()) return out;
  std::vector<std::string> parameters;  // every expert parameter of the base
  for (size_t l = 0; l < model.layers().size(); ++l) {
    if (model.layers()[l].experts.empty()) continue;
    const std::string module = fmt::format("{}layers.{}.experts", prefix, l);
    std::vector<ExpertTarget> here;  // in the order Gemma4TextExperts declares them: PEFT's wrapping order
    for (ExpertParam p : {ExpertParam::GateUp, ExpertParam::Down}) {
      std::string name = module + "." + kExpertParamNames[static_cast<int>(p)];
      parameters.push_back(name);
      if (c.targets_parameter(name)) here.push_back({static_cast<int64_t>(l), p, std::move(name), module});
    }
    for (size_t i = 0; i < here.size(); ++i)  // the last wrapped is outermost; each one inside it is a base_layer
      for (size_t depth = i + 1; depth < here.size(); ++depth) here[i].module += ".base_layer";
    out.insert(out.end(), here.begin(), here.end());
  }
  for (const std::string& t : c.target_parameters)
    if (std::none_of(parameters.begin(), parameters.end(),
                     [&](const std::string& p) { return p == t || p.ends_with("." + t); }))
      throw Error(fmt::format(
          "{}: target_parameters entry '{}' matches no MoE expert parameter of the base model ({})", c.file, t,
          parameters.empty() ? "the base has no experts"
                             : "qatserve adapts the experts' gate_up_proj and down_proj; LoRA on other parameters "
                               "is not implemented"));
  return out;
}

void add_low_rank(std::span<const LowRankRow> rows, const float* x, int64_t in, int64_t out,
                  std::span<const LowRankOutput> outputs, bool round_bf16, ThreadPool& pool) {
  const size_t n = rows.size();
  if (n == 0) return;
  int64_t max_rank = 0;
  for (const LowRankRow& r : rows) max_rank = std::max(max_rank, r.rank);
  // Buffers of the calling thread, reached from the workers through these pointers.
  thread_local std::vector<float> ax_buffer;  // (A x)[row, k], max_rank a row
  thread_local std::vector<std::pair<size_t, int64_t>> block_buffer;  // (output, first column in it)
  ax_buffer.resize(n * max_rank);
  float* ax = ax_buffer.data();
  // A x: n * rank dot products of length `in` (each in dot's fixed sixteen-lane order), ~32K multiply-adds a chunk.
  pool.parallel_for(n * max_rank, std::max<size_t>(1, size_t(1 << 15) / size_t(in)), [&](size_t j0, size_t j1) {
    for (size_t j = j0; j < j1; ++j) {
      const LowRankRow& r = rows[j / max_rank];
      const int64_t k = int64_t(j % max_rank);
      if (k < r.rank) ax[j] = dot(r.a + k * in, x + r.row * in, in);
    }
  });
  // B (A x): per row and block of outputs, the rank columns of B added in order k = 0, 1, ... (each product and
  // sum rounded to f32), then scaled and added to y.
  constexpr int64_t kBlock = 1024;
  block_buffer.clear();
  for (size_t p = 0; p < outputs.size(); ++p)
    for (int64_t c = 0; c < outputs[p].count; c += kBlock) block_buffer.push_back({p, c});
  const std::pair<size_t, int64_t>* blocks = block_buffer.data();
  const size_t per_row = block_buffer.size();
  pool.parallel_for(n * per_row, std::max<size_t>(1, size_t(1 << 15) / size_t(kBlock * max_rank)),
                    [&](size_t j0, size_t j1) {
    float delta[kBlock];
    for (size_t j = j0; j < j1; ++j) {
      const LowRankRow& r = rows[j / per_row];
      const auto [p, c0] = blocks[j % per_row];
      const LowRankOutput& o = outputs[p];
      const int64_t m = std::min(kBlock, o.count - c0);
      std::fill_n(delta, m, 0.0f);
      const float* row_ax = ax + (j / per_row) * max_rank;
      for (int64_t k = 0; k < r.rank; ++k) add_scaled(row_ax[k], r.bt + k * out + o.first + c0, delta, m);
      float* y = o.y + r.row * o.stride + c0;
      for (int64_t i = 0; i < m; ++i) {
        const float v = y[i] + delta[i] * r.scale;
        y[i] = round_bf16 ? round_to_bf16(v) : v;
      }
    }
  });
}

}  // namespace qs
