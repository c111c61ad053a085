// The bytes one forward call reads (ReadBytes, read_bytes in bench.h): from the checkpoint's tensors as stored and
// the architecture, what `bench` sets each row's speed beside.
#include <algorithm>
#include <cmath>

#include "bench/bench.h"
#include "formats/checkpoint.h"
#include "model/gemma4_tensors.h"

namespace qs {

namespace {

// Fraction of a layer's experts that `n` tokens touch, each picking k of E uniformly.
double experts_touched(int64_t n, int64_t k, int64_t e) {
  return e == 0 || n == 0 ? 0.0 : 1.0 - std::pow(1.0 - double(k) / double(e), double(n));
}

}  // namespace

uint64_t ReadBytes::call_weights(int64_t rows, int64_t wanted, bool with_experts) const {
  if (rows == 0) return 0;
  double b = double(model_linears);
  for (size_t l = 0; l < layer_dense.size(); ++l) {
    const int64_t n = int64_t(l) < first_shared ? rows : wanted;  // later layers see only the wanted rows
    if (n == 0) continue;
    b += double(layer_dense[l]);
    if (with_experts) b += double(layer_experts[l]) * experts_touched(n, top_k, num_experts);
  }
  if (wanted > 0) b += double(lm_head);
  return static_cast<uint64_t>(std::llround(b));
}

uint64_t ReadBytes::kv_read(int64_t position, bool all_layers) const {
  const int64_t end = all_layers ? int64_t(layer_kv_row.size()) : first_shared;
  uint64_t b = 0;
  for (int64_t l = 0; l < end; ++l) {
    const int64_t attended = layer_window[l] ? std::min(position + 1, layer_window[l]) : position + 1;
    b += layer_kv_row[l] * uint64_t(attended);
  }
  return b;
}

uint64_t ReadBytes::decode_weights_per_token(int64_t streams, bool with_experts) const {
  return call_weights(streams, streams, with_experts) / uint64_t(streams) + gather;
}

uint64_t ReadBytes::decode_kv_per_token(int64_t depth, int64_t steps) const {
  uint64_t sum = 0;
  for (int64_t i = 0; i < steps; ++i) sum += kv_read(depth + i, true);
  return steps ? sum / uint64_t(steps) : 0;
}

uint64_t ReadBytes::prefill_weights_per_token(int64_t prompt, int64_t chunk, bool with_experts) const {
  uint64_t sum = 0;
  for (int64_t s = 0; s < prompt; s += chunk) {
    const int64_t m = std::min(chunk, prompt - s);
    sum += call_weights(m, s + m == prompt ? 1 : 0, with_experts);
  }
  return sum / uint64_t(prompt) + gather;
}

uint64_t ReadBytes::prefill_kv_per_token(int64_t prompt, int64_t chunk) const {
  // Rows that return no logits stop before the KV-shared layers; the prompt's last row goes through them all.
  uint64_t sum = kv_read(prompt - 1, true) - kv_read(prompt - 1, false);
  for (int64_t p = 0; p < prompt; ++p) sum += kv_read(p, false);
  return sum / uint64_t(prompt);
}

ReadBytes read_bytes(const Checkpoint& checkpoint, const ModelConfig& config, KvDtype kv_dtype,
                     std::optional<uint64_t> lm_head_bytes) {
  const Gemma4TextConfig& c = config.text;
  const int64_t L = c.num_hidden_layers;
  ReadBytes r;
  r.layer_dense.assign(L, 0);
  r.layer_experts.assign(L, 0);
  r.first_shared = c.num_kv_shared_layers > 0 ? c.first_shared_layer() : L;
  r.num_experts = c.enable_moe_block ? c.num_experts : 0;
  r.top_k = c.top_k_experts;
  r.gather = uint64_t(c.hidden_size) * 2 + (c.has_ple() ? uint64_t(L * c.hidden_size_per_layer_input) * 2 : 0);
  for (int64_t l = 0; l < L; ++l) {
    r.layer_kv_row.push_back(2 * kv_row_bytes(kv_dtype, c.layer_kv_heads(l), c.layer_head_dim(l)));
    r.layer_window.push_back(c.is_full(l) ? 0 : c.sliding_window);
  }

  const ArchTensorIndex index(config);
  for (const TensorRef& t : checkpoint.tensors()) {
    const ArchTensor* a = index.find(t.name());
    if (!a) continue;  // towers, k/v of KV-shared layers, a redundant lm_head: never read
    switch (a->role) {
      case TensorRole::Embedding: r.lm_head += t.nbytes(); break;  // tied: the whole table is the LM head
      case TensorRole::PerLayerEmbedding: break;                    // gathered a row per token (in `gather`)
      case TensorRole::FusedExperts: r.layer_experts[a->layer] += t.nbytes(); break;
      default: (a->layer >= 0 ? r.layer_dense[a->layer] : r.model_linears) += t.nbytes();
    }
  }
  if (lm_head_bytes) r.lm_head = *lm_head_bytes;
  return r;
}

}  // namespace qs
