// LoRA adapters inside Gemma4Model's forward pass: after a linear ran on every row of a call, the rows of each
// adapter, gathered from whichever sequences use it, get that adapter's low-rank product (one pass over its A and
// B for all of them, vLLM's punica-style grouping); rows of sequences without an adapter keep the base's output.
// The MoE experts' rows get the low-rank product of their expert under their sequence's adapter (lora_experts.h).
#include <algorithm>

#include "model/gemma4.h"
#include "model/gemma4_scratch.h"
#include "model/lora_adapter.h"
#include "util/parallel.h"

namespace qs {

void Gemma4Model::add_lora(Scratch& s, const LinearWeight& w, const float* x, int64_t rows, float* y) const {
  // Groups of earlier calls stay (emptied) so that their row lists keep their memory; an adapter unloaded since is
  // only ever compared by address.
  auto& groups = s.lora_groups;
  for (auto& g : groups) g.second.clear();
  for (int64_t row = 0; row < rows; ++row) {
    const LoraAdapter* adapter = s.seqs[s.rows_seq[row]].lora;
    if (!adapter) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == adapter; });
    if (it == groups.end()) it = groups.insert(groups.end(), {adapter, {}});
    it->second.push_back(row);
  }
  for (const auto& [adapter, group_rows] : groups)
    if (!group_rows.empty())
      if (const LoraWeights* lw = adapter->find(&w)) lw->add_to(x, group_rows, y, rounds_to_bf16(), *pool_);
}

void Gemma4Model::run_experts(Scratch& s, const Gemma4Layer& layer, ExpertParam param, const float* x, float* y0,
                              float* y1) const {
  Scratch::Moe& m = s.experts;
  linear_forward(m.jobs, *pool_, activations_of(precision_));
  if (s.any_lora) {
    // Every routed row (an expert's rows are consecutive, experts in m.work's order) whose sequence's adapter
    // targets this parameter of this layer, with its expert's A and B. The delta is added to the unrounded output,
    // then both are rounded once below: as PEFT adds it to the weight, x (W + scale B A) in one product.
    thread_local std::vector<LowRankRow> rows;
    rows.clear();
    for (size_t i = 0; i < m.used; ++i) {
      const Scratch::Expert& w = m.work[i];
      const auto& rows_of = m.chosen[w.expert];
      for (size_t j = 0; j < rows_of.size(); ++j)
        if (const LoraAdapter* adapter = s.seqs[s.rows_seq[rows_of[j].first]].lora)
          if (const ExpertLoraWeights* ew = adapter->find_experts(&layer, param))
            rows.push_back({w.first + int64_t(j), ew->a_of(w.expert), ew->bt_of(w.expert), ew->rank, ew->scale});
    }
    const int64_t H = config_.text.hidden_size, I = config_.text.moe_intermediate_size;
    if (param == ExpertParam::GateUp) {
      const LowRankOutput outputs[] = {{0, I, y0, I}, {I, I, y1, I}};  // gate_up's rows: gate, then up
      add_low_rank(rows, x, H, 2 * I, outputs, false, *pool_);
    } else {
      const LowRankOutput output{0, H, y0, H};
      add_low_rank(rows, x, I, H, std::span(&output, 1), false, *pool_);
    }
  }
  for (const LinearJob& j : m.jobs) round({j.y, size_t(j.T * j.w->out)});
}

}  // namespace qs
