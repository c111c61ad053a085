#pragma once
// The Gemma 4 text decoder (E2B/E4B with per-layer embeddings and KV sharing, 26B-A4B with experts beside the
// dense MLP, 31B with attention_k_eq_v; the 12B, transformers' gemma4_unified, is the same decoder layer without
// per-layer embeddings and MoE, so it runs here as a config variant), from either QAT format, chosen per tensor by
// what the file holds:
// int4 weight_packed/weight_scale or bf16 weight; fused or per-expert experts. The forward pass reads top to
// bottom in gemma4.cc with the names of the math (reference: transformers' modeling_gemma4.py).
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "kernels/linear.h"
#include "model/kv_cache.h"
#include "util/huge_buffer.h"

namespace qs {

class LoraAdapter;
class ThreadPool;
enum class ExpertParam;  // model/lora_experts.h

// F32: every activation in f32 (the parity reference). BF16: activations rounded to bf16 wherever transformers'
// bf16 model rounds them (after every op), accumulation in f32. Int8 (opt-in, lossy): BF16, but the int4 linears
// quantize their inputs to int8 (linear.h's Activations::Int8, W4A8); bench measures its logit error.
enum class Precision { F32, BF16, Int8 };
Precision parse_precision(const std::string& name);  // "f32" | "bf16" | "int8"
inline Activations activations_of(Precision p) {  // what the int4 linears take
  return p == Precision::F32 ? Activations::F32 : p == Precision::BF16 ? Activations::BF16 : Activations::Int8;
}
std::string_view precision_name(Precision p);

struct ExpertWeights {
  LinearWeight gate, up, down;
};

struct Gemma4Layer {
  bool computes_kv = true, full_attention = false;
  int64_t head_dim = 0, kv_heads = 0, kv_source = 0;
  std::vector<float> input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  LinearWeight q_proj, k_proj, v_proj, o_proj;  // v_proj.out == 0: V is the raw k projection
  std::vector<float> q_norm, k_norm;
  LinearWeight gate_proj, up_proj, down_proj;
  // Mixture of experts beside the dense MLP (26B-A4B).
  LinearWeight router_proj;
  std::vector<float> router_scale, per_expert_scale, pre_feedforward_norm_2, post_feedforward_norm_1,
      post_feedforward_norm_2;
  std::vector<ExpertWeights> experts;
  // Per-layer embedding input (E2B/E4B).
  LinearWeight per_layer_input_gate, per_layer_projection;
  std::vector<float> post_per_layer_input_norm;
  float layer_scalar = 1;
};

enum class LogitsWanted { None, Last, All };

// Embeddings that take the place of a run of placeholder tokens in a step (an image's or an audio clip's soft
// tokens, as transformers' masked_scatter places them): the rows replace the token embeddings there, and the
// per-layer inputs read the pad token's. All of an image's soft tokens must be in one step: on sliding layers of a
// model with use_bidirectional_attention "vision" they see each other forward too, which a later chunk could not
// give to an earlier one.
struct SoftTokens {
  int64_t first = 0;                   // index in the step's tokens of the first placeholder
  std::span<const float> embeddings;   // [count, hidden]
  bool vision = false;                 // an image (or video frame): one bidirectional block
};

// One sequence's share of a batched forward call: its next tokens and the cache they extend.
struct SequenceStep {
  std::span<const int32_t> tokens;
  KvCache* cache;
  LogitsWanted logits = LogitsWanted::Last;
  std::span<const SoftTokens> soft_tokens = {};  // ascending, not overlapping
  // Speculative decoding: the last `tentative` tokens are drafts under verification (KvCache::append).
  int64_t tentative = 0;
  // When set: receives the final-normed hidden state of the rows whose logits are wanted, [rows, hidden] (what
  // Gemma 4's assistant drafters read of the target: engine/speculative.h).
  std::vector<float>* final_hidden = nullptr;
  // A LoRA adapter loaded against this model (model/lora_adapter.h) that this sequence's linears add; nullptr: the
  // base alone. Sequences of one call may use different adapters.
  const LoraAdapter* lora = nullptr;
};

class Gemma4Model {
 public:
  // Maps the checkpoint, copies its int4 weights into the kernels' layout and repacks an on-grid LM head; with
  // show_progress, a progress line on stderr at most every second while that runs.
  static std::unique_ptr<Gemma4Model> load(const std::filesystem::path& dir, Precision precision,
                                           bool show_progress = false);

  const ModelConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  bool rounds_to_bf16() const { return precision_ != Precision::F32; }
  // Between BF16 and Int8, which share the KV cache's layout (bf16), e.g. to measure Int8's logit error on the
  // same weights; throws for any switch to or from F32.
  void set_precision(Precision p);
  bool int4_weights() const { return int4_; }
  // The tied LM head as the forward pass reads it: int4 when the embedding lies exactly on the QAT grid (QAT
  // exports' embeddings do), a lossless in-memory repack that reads 3.6x fewer bytes per token; else the bf16 table.
  const LinearWeight& lm_head() const { return lm_head_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  // The decoder's weights by layer, and the per-layer-embedding input projection (out == 0 without PLE): what
  // LoRA adapters attach to (model/lora_adapter.h).
  const std::vector<Gemma4Layer>& layers() const { return layers_; }
  const LinearWeight& per_layer_model_projection() const { return per_layer_model_projection_; }
  // Bytes of expert weights the forward calls so far have read: each chosen expert once per call and layer.
  uint64_t expert_bytes_read() const { return expert_bytes_read_.load(std::memory_order_relaxed); }

  // The dtype of the caches made from now on (kv_layout, new_cache): by default f32 at f32 precision, else bf16;
  // `--kv-dtype`. A cache keeps the dtype it was made with, and the forward pass reads each cache as its layout says.
  KvDtype kv_dtype() const { return kv_dtype_; }
  void set_kv_dtype(KvDtype dtype) { kv_dtype_ = dtype; }
  // Where each layer's K/V live in a paged cache (kv_cache.h), in kv_dtype(). Sliding layers keep the last
  // max(sliding_window, sliding_kept) positions (an assistant drafter reads more of them).
  KvLayout kv_layout(int64_t block_size = 16, int64_t sliding_kept = 0) const;
  // A cache with a pool of its own, sized for this one sequence of max_context positions, of which up to
  // max_tentative may be unverified drafts (speculative decoding).
  KvCache new_cache(int64_t max_context, int64_t max_tentative = 0, int64_t sliding_kept = 0) const;

  // The scaled input embedding of each token, [tokens, hidden], rounded as the first layer reads it.
  void token_embeddings(std::span<const int32_t> tokens, std::vector<float>& out) const;
  // A Linear at this model's precision, its output rounded as the forward pass rounds every linear's: [rows, out].
  std::vector<float> apply_linear(const LinearWeight& w, std::span<const float> x, int64_t rows) const;

  // For a decoder that computes no K/V of its own (an assistant drafter, every layer KV-shared): reads, on each
  // layer, the K/V of `target`'s last K/V-computing layer of the same type. Throws, naming the layer, when the
  // target has none or its head_dim / KV heads differ.
  void read_kv_of(const Gemma4Model& target);
  // Such a decoder on rows of input embeddings [rows, hidden]: row i is a query at positions[i] over the target's
  // K/V in `context` before it (positions[i] <= context.length()); a sliding layer sees the last sliding_window + 1
  // of them (transformers' flipped bidirectional window). Returns the final-normed hidden states [rows, hidden].
  std::vector<float> forward_over_context(std::span<const float> inputs, std::span<const int64_t> positions,
                                          const KvCache& context) const;

  // Runs tokens at positions cache.length() onwards and appends their K/V. Returns final (soft-capped) logits,
  // [tokens, vocab] when all_logits, else [1, vocab] for the last token.
  std::vector<float> forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits) const;

  // Several sequences through one pass over the weights (continuous batching: decode steps of running sequences
  // beside prompt chunks of new ones). Returns the wanted logits, sequence by sequence, [rows, vocab].
  std::vector<float> forward_batch(std::span<const SequenceStep> steps) const;

 private:
  struct Scratch;
  void attention(const Gemma4Layer& layer, int64_t l, Scratch& s) const;
  void feed_forward(const Gemma4Layer& layer, Scratch& s) const;
  void mixture_of_experts(const Gemma4Layer& layer, Scratch& s, std::vector<float>& out) const;
  void per_layer_input(const Gemma4Layer& layer, int64_t l, Scratch& s) const;
  void embed(std::span<const int32_t> tokens, Scratch& s) const;
  void place_soft_tokens(const SequenceStep& step, int64_t first_row, Scratch& s) const;
  void commit_kv(Scratch& s) const;
  static void copy_final_hidden(std::span<const SequenceStep> steps, std::span<const float> h, int64_t H);
  void round(std::span<float> x) const;
  // Element-wise work on at least this many values is split over the pool (a stream's logits are 262,144).
  static constexpr size_t kSplitElements = size_t(1) << 16;
  void linear(Scratch& s, const LinearWeight& w, const std::vector<float>& x, int64_t rows,
              std::vector<float>& y) const;
  static constexpr size_t kMaxLinears = 3;  // q, k and v
  // Linears of one input as one job (linear_forward over several weights).
  // Then each sequence's LoRA adapter, if any, adds its low-rank product (gemma4_lora.cc).
  void linears(Scratch& s, std::initializer_list<std::pair<const LinearWeight*, std::vector<float>*>> wy,
               const std::vector<float>& x, int64_t rows) const;
  void add_lora(Scratch& s, const LinearWeight& w, const float* x, int64_t rows, float* y) const;
  // The experts' jobs queued in the scratch (GateUp: gate's and up's, written to y0 and y1; Down: down's, to y0) on
  // their routed rows x, then each row's adapter's LoRA on that expert parameter, before the outputs are rounded
  // as run rounds them (gemma4_lora.cc).
  void run_experts(Scratch& s, const Gemma4Layer& layer, ExpertParam param, const float* x, float* y0,
                   float* y1) const;
  void run(std::span<const LinearJob> jobs) const;  // their outputs rounded as every linear's are
  void norm(std::vector<float>& x, int64_t n, const std::vector<float>& weight) const;

  ModelConfig config_;
  Precision precision_ = Precision::BF16;
  KvDtype kv_dtype_ = KvDtype::BF16;
  Checkpoint checkpoint_;
  bool int4_ = false;
  uint64_t weight_bytes_ = 0;
  std::vector<Gemma4Layer> layers_;
  bool reads_target_kv_ = false;  // read_kv_of: every layer reads another model's cache
  const std::byte* embed_tokens_ = nullptr;            // bf16 [vocab, hidden], also the LM head
  const std::byte* embed_tokens_per_layer_ = nullptr;  // bf16 [vocab_ple, layers * ple_dim]
  LinearWeight lm_head_, per_layer_model_projection_;
  // Int4 weights copied at load into the layout their kernels stream (linear.h: Int4Layout), the LM head's
  // lossless repack among them; the checkpoint's pages of what was copied are dropped.
  std::vector<HugeBuffer> int4_storage_;
  std::vector<float> per_layer_projection_norm_, final_norm_;
  std::vector<float> inv_freq_sliding_, inv_freq_full_;
  ThreadPool* pool_ = nullptr;
  mutable std::atomic<uint64_t> expert_bytes_read_{0};
};

}  // namespace qs
