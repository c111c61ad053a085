#pragma once
// Gemma 4's assistant drafters (transformers' Gemma4AssistantForCausalLM and Gemma4UnifiedAssistantForCausalLM;
// llama.cpp's gemma4-assistant): a small decoder beside its target that reads the target's hidden state and K/V
// and proposes several tokens per step, the official route to speculative decoding.
//
// One drafting step for a query at position p + 1, the target having run positions 0..p:
//   x      = pre_projection(cat(target scaled embedding of the fed token, state))     [backbone -> hidden]
//   h      = the decoder on x at position p + 1; every layer attends to the target's K/V of its last K/V-computing
//            layer of the same type over positions <= p (sliding layers: p - W..p), final norm
//   logits = the tied head on h, without soft-cap, or the ordered-embeddings head (masked_head)
//   state' = post_projection(h)                                                        [hidden -> backbone]
// The first draft feeds the token at p + 1 and the target's final-normed hidden state at p; each next one feeds the
// argmax of the previous draft and its state', at the same position over the same K/V
// (SinglePositionMultiTokenCandidateGenerator).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "model/gemma4.h"

namespace qs {

// Drafts of several rows at once, row-major.
struct AssistantStep {
  std::vector<float> logits;    // [rows, vocab], unless the step was asked for none
  std::vector<int32_t> tokens;  // argmax of each row (the lowest id among equal maxima)
  std::vector<float> states;    // post_projection of each row's normed hidden state [rows, backbone hidden]
};

class Gemma4Assistant {
 public:
  // Loads an assistant checkpoint (bf16 or w4a16) for `target`, at the target's precision, checking that it fits:
  // backbone hidden size, vocabulary, and for each layer the target's K/V it reads (head_dim, KV heads). The
  // target must outlive the assistant.
  static std::unique_ptr<Gemma4Assistant> load(const std::filesystem::path& dir, const Gemma4Model& target,
                                               bool show_progress = false);

  const ModelConfig& config() const { return decoder_->config(); }
  // Positions the target's sliding layers must keep for the drafter: pass to the target's new_cache / kv_layout.
  int64_t sliding_kept() const { return config().text.sliding_window + 2; }

  // One drafting step of several rows: row i feeds tokens[i] and states[i] ([rows, backbone hidden]) as a query at
  // positions[i] over the target's K/V in `context` before it. Without logits, AssistantStep::logits is empty.
  AssistantStep step(std::span<const int32_t> tokens, std::span<const float> states,
                     std::span<const int64_t> positions, const KvCache& context, bool with_logits = true) const;

  // Drafting for speculative decoding: the target has run positions 0..p (context.length() == p + 1),
  // target_hidden is its final-normed hidden state at p (SequenceStep::final_hidden) and `next` the token at
  // p + 1 (the target's pick there). Returns k greedy drafts for positions p + 2 .. p + k + 1; with `logits`, also
  // their logits [k, vocab] (for rejection sampling).
  std::vector<int32_t> draft(std::span<const float> target_hidden, int32_t next, const KvCache& context, int64_t k,
                             std::vector<float>* logits = nullptr) const;

 private:
  Gemma4Assistant() = default;
  void masked_head(const std::vector<float>& hidden, int64_t rows, AssistantStep& out, bool with_logits) const;

  const Gemma4Model* target_ = nullptr;
  std::unique_ptr<Gemma4Model> decoder_;  // its layers read the target's K/V (Gemma4Model::read_kv_of)
  std::vector<HugeBuffer> int4_storage_;
  LinearWeight pre_projection_, post_projection_, centroids_;
  const std::byte* head_rows_ = nullptr;  // bf16 [vocab, hidden]: the tied head, gathered by the masked head
  std::vector<int64_t> token_ordering_;   // masked head: the tokens of centroid c are [c * K, (c + 1) * K)
};

}  // namespace qs
