// Gemma 4 assistant drafters: loading beside a target, one drafting step, the two heads (reference:
// transformers' modeling_gemma4_assistant.py and generation/candidate_generator.py).
#include "model/gemma4_assistant.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "kernels/ops.h"
#include "model/weight_reader.h"
#include "util/error.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

// masked_embedding.token_ordering: a permutation of the vocabulary (I64 as transformers saves it, or I32).
std::vector<int64_t> read_token_ordering(const WeightReader& r, const std::string& dir, int64_t vocab) {
  const std::string name = "masked_embedding.token_ordering";
  const TensorRef& t = r.tensor(name, {vocab});
  if (t.dtype() != DType::I64 && t.dtype() != DType::I32)
    throw Error(fmt::format("{}: tensor '{}' is {}; expected I64 or I32", dir, name, dtype_name(t.dtype())));
  std::vector<int64_t> ids(vocab);
  for (int64_t i = 0; i < vocab; ++i)
    ids[i] = t.dtype() == DType::I64 ? load_unaligned<int64_t>(t.bytes().data() + 8 * i)
                                     : load_unaligned<int32_t>(t.bytes().data() + 4 * i);
  std::vector<bool> seen(vocab, false);
  for (int64_t i = 0; i < vocab; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab || seen[ids[i]])
      throw Error(fmt::format("{}: tensor '{}' is not a permutation of the vocabulary: entry {} is {}", dir, name, i,
                              ids[i]));
    seen[ids[i]] = true;
  }
  return ids;
}

}  // namespace

std::unique_ptr<Gemma4Assistant> Gemma4Assistant::load(const fs::path& dir, const Gemma4Model& target,
                                                       bool show_progress) {
  auto a = std::unique_ptr<Gemma4Assistant>(new Gemma4Assistant());
  a->target_ = &target;
  a->decoder_ = Gemma4Model::load(dir, target.precision(), show_progress);
  const ModelConfig& mc = a->decoder_->config();
  const Gemma4TextConfig& c = mc.text;
  const Gemma4TextConfig& t = target.config().text;
  const std::string where = dir.string();
  if (!mc.assistant)
    throw Error(fmt::format("{}: model_type \"{}\" is not an assistant drafter (gemma4_assistant or "
                            "gemma4_unified_assistant)",
                            where, mc.model_type));
  if (mc.assistant->backbone_hidden_size != t.hidden_size)
    throw Error(fmt::format("{}: backbone_hidden_size {} does not match the target's hidden_size {}", where,
                            mc.assistant->backbone_hidden_size, t.hidden_size));
  if (c.vocab_size != t.vocab_size)
    throw Error(fmt::format("{}: text_config.vocab_size {} does not match the target's vocab_size {}", where,
                            c.vocab_size, t.vocab_size));
  try {
    a->decoder_->read_kv_of(target);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }

  Progress quiet("assistant heads", 0, false);
  WeightReader r(a->decoder_->checkpoint(), mc, a->int4_storage_, ThreadPool::shared(), quiet,
                 activations_of(a->decoder_->precision()));
  const int64_t H = c.hidden_size, Hb = t.hidden_size;
  a->pre_projection_ = r.linear("pre_projection", H, 2 * Hb);
  a->post_projection_ = r.linear("post_projection", Hb, H);
  a->head_rows_ = r.tensor("model.embed_tokens.weight", {c.vocab_size, H}).bytes().data();
  if (mc.assistant->use_ordered_embeddings) {
    a->centroids_ = r.linear("masked_embedding.centroids", mc.assistant->num_centroids, H);
    a->token_ordering_ = read_token_ordering(r, where, c.vocab_size);
  }
  return a;
}

AssistantStep Gemma4Assistant::step(std::span<const int32_t> tokens, std::span<const float> states,
                                    std::span<const int64_t> positions, const KvCache& context,
                                    bool with_logits) const {
  const int64_t rows = tokens.size(), Hb = target_->config().text.hidden_size, V = config().text.vocab_size;
  if (static_cast<int64_t>(states.size()) != rows * Hb || static_cast<int64_t>(positions.size()) != rows)
    throw Error(fmt::format("assistant step: {} tokens need {} state values and {} positions, got {} and {}", rows,
                            rows * Hb, rows, states.size(), positions.size()));
  for (int32_t id : tokens)
    if (id < 0 || id >= V) throw Error(fmt::format("assistant step: token id {} is outside the vocabulary (0..{})", id, V - 1));
  std::vector<float> embedded;
  target_->token_embeddings(tokens, embedded);
  std::vector<float> x(rows * 2 * Hb);
  for (int64_t i = 0; i < rows; ++i) {
    std::copy_n(embedded.data() + i * Hb, Hb, x.data() + i * 2 * Hb);
    std::copy_n(states.data() + i * Hb, Hb, x.data() + i * 2 * Hb + Hb);
  }
  const std::vector<float> hidden =
      decoder_->forward_over_context(decoder_->apply_linear(pre_projection_, x, rows), positions, context);
  AssistantStep out;
  if (config().assistant->use_ordered_embeddings) {
    masked_head(hidden, rows, out, with_logits);
  } else {
    out.logits = decoder_->apply_linear(decoder_->lm_head(), hidden, rows);  // the tied head, without soft-cap
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = out.logits.data() + i * V;
      out.tokens.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
    }
    if (!with_logits) out.logits.clear();
  }
  out.states = decoder_->apply_linear(post_projection_, hidden, rows);
  return out;
}

// The ordered-embeddings head: centroid scores (in f32: the cluster choice can hinge on gaps of 1e-3) pick the
// top-k clusters; their tokens get real logits from the tied head's rows, every other id min(selected) - 1. The
// argmax lies among the chosen tokens, so drafting without logits never builds the vocabulary-wide row.
void Gemma4Assistant::masked_head(const std::vector<float>& hidden, int64_t rows, AssistantStep& out,
                                  bool with_logits) const {
  const Gemma4AssistantConfig& a = *config().assistant;
  const int64_t H = config().text.hidden_size, V = config().text.vocab_size, C = a.num_centroids;
  const int64_t top_k = a.centroid_intermediate_top_k, per_cluster = a.tokens_per_centroid(V);
  const bool bf16 = decoder_->rounds_to_bf16();
  std::vector<float> scores(rows * C);
  linear_forward(centroids_, hidden.data(), rows, scores.data(), ThreadPool::shared(), Activations::F32);
  std::vector<float> full_row;
  std::vector<int64_t> clusters(C);
  std::vector<int64_t> ids(top_k * per_cluster);
  std::vector<float> selected(ids.size());
  if (with_logits) out.logits.resize(rows * V);
  for (int64_t i = 0; i < rows; ++i) {
    const float* score = scores.data() + i * C;
    const float* h = hidden.data() + i * H;
    std::iota(clusters.begin(), clusters.end(), 0);
    std::partial_sort(clusters.begin(), clusters.begin() + top_k, clusters.end(),
                      [&](int64_t x, int64_t y) { return score[x] != score[y] ? score[x] > score[y] : x < y; });
    for (int64_t j = 0; j < top_k * per_cluster; ++j)
      ids[j] = token_ordering_[clusters[j / per_cluster] * per_cluster + j % per_cluster];
    // Each chosen token's logit: its head row widened to f32, then ops.h's vector dot product (4096 rows of the
    // E2B assistant a step: a scalar loop took most of a draft's time).
    ThreadPool::shared().parallel_for(ids.size(), 256, [&](size_t begin, size_t end) {
      std::vector<float> row(H);
      for (size_t j = begin; j < end; ++j) {
        const std::byte* stored = head_rows_ + ids[j] * H * 2;
        for (int64_t d = 0; d < H; ++d) row[d] = bf16_to_f32(load_unaligned<uint16_t>(stored + 2 * d));
        const float logit = dot(h, row.data(), H);
        selected[j] = bf16 ? round_to_bf16(logit) : logit;
      }
    });
    float mask = *std::min_element(selected.begin(), selected.end()) - 1.0f;
    if (bf16) mask = round_to_bf16(mask);
    size_t best = 0;  // the lowest id among equal maxima, as an argmax over the whole row picks
    for (size_t j = 1; j < ids.size(); ++j)
      if (selected[j] > selected[best] || (selected[j] == selected[best] && ids[j] < ids[best])) best = j;
    // The mask can round up to the chosen tokens' value in bf16: then the whole row decides.
    const bool row_decides = !(selected[best] > mask);
    float* logits = nullptr;
    if (with_logits) {
      logits = out.logits.data() + i * V;
    } else if (row_decides) {
      full_row.resize(V);
      logits = full_row.data();
    }
    if (logits) {
      std::fill(logits, logits + V, mask);
      for (size_t j = 0; j < ids.size(); ++j) logits[ids[j]] = selected[j];
    }
    out.tokens.push_back(static_cast<int32_t>(row_decides ? std::max_element(logits, logits + V) - logits
                                                         : ids[best]));
  }
}

std::vector<int32_t> Gemma4Assistant::draft(std::span<const float> target_hidden, int32_t next,
                                            const KvCache& context, int64_t k, std::vector<float>* logits) const {
  const int64_t position = context.length();
  std::vector<float> state(target_hidden.begin(), target_hidden.end());
  std::vector<int32_t> drafts;
  if (logits) logits->clear();
  for (int32_t token = next; static_cast<int64_t>(drafts.size()) < k;) {
    AssistantStep s = step(std::span(&token, 1), state, std::span(&position, 1), context, logits != nullptr);
    token = s.tokens[0];
    drafts.push_back(token);
    state = std::move(s.states);
    if (logits) logits->insert(logits->end(), s.logits.begin(), s.logits.end());
  }
  return drafts;
}

}  // namespace qs
