// LoRA adapters inside Gemma4Model's forward pass: after a linear ran on every row of a call, the rows of each
// adapter, gathered from whichever sequences use it, get that adapter's low-rank product (one pass over its A and
// B for all of them, vLLM's punica-style grouping); rows of sequences without an adapter keep the base's output.
#include <algorithm>

#include "model/gemma4.h"
#include "model/gemma4_scratch.h"
#include "model/lora_adapter.h"

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

}  // namespace qs
