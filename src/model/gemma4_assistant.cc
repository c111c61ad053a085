// Gemma 4 assistant drafters: loading beside a target, one drafting step, the two heads (reference:
// transformers' modeling_gemma4_assistant.py and generation/candidate_generator.py).
#include "model/gemma4_assistant.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

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
                                    std::span<const int64_t> positions, const KvCache& context) const {
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
  out.logits = config().assistant->use_ordered_embeddings ? masked_head(hidden, rows) : head(hidden, rows);
  out.states = decoder_->apply_linear(post_projection_, hidden, rows);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = out.logits.data() + i * V;
    out.tokens.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
  }
  return out;
}

// The tied head, without the target's soft-cap.
std::vector<float> Gemma4Assistant::head(const std::vector<float>& hidden, int64_t rows) const {
  return decoder_->apply_linear(decoder_->lm_head(), hidden, rows);
}

// The ordered-embeddings head: centroid scores (in f32: the cluster choice can hinge on gaps of 1e-3) pick the
// top-k clusters; their tokens get real logits from the tied head's rows, every other id min(selected) - 1.
std::vector<float> Gemma4Assistant::masked_head(const std::vector<float>& hidden, int64_t rows) const {
  const Gemma4AssistantConfig& a = *config().assistant;
  const int64_t H = config().text.hidden_size, V = config().text.vocab_size, C = a.num_centroids;
  const int64_t top_k = a.centroid_intermediate_top_k, per_cluster = a.tokens_per_centroid(V);
  const bool bf16 = decoder_->rounds_to_bf16();
  std::vector<float> scores(rows * C);
  linear_forward(centroids_, hidden.data(), rows, scores.data(), ThreadPool::shared(), Activations::F32);
  std::vector<float> logits(rows * V);
  std::vector<int64_t> clusters(C);
  std::vector<float> selected;
  for (int64_t i = 0; i < rows; ++i) {
    const float* score = scores.data() + i * C;
    const float* h = hidden.data() + i * H;
    std::iota(clusters.begin(), clusters.end(), 0);
    std::partial_sort(clusters.begin(), clusters.begin() + top_k, clusters.end(),
                      [&](int64_t x, int64_t y) { return score[x] != score[y] ? score[x] > score[y] : x < y; });
    selected.clear();
    for (int64_t j = 0; j < top_k * per_cluster; ++j) {
      const int64_t id = token_ordering_[clusters[j / per_cluster] * per_cluster + j % per_cluster];
      float dot = 0;
      for (int64_t d = 0; d < H; ++d)
        dot += h[d] * bf16_to_f32(load_unaligned<uint16_t>(head_rows_ + (id * H + d) * 2));
      selected.push_back(bf16 ? round_to_bf16(dot) : dot);
    }
    float mask = *std::min_element(selected.begin(), selected.end()) - 1.0f;
    if (bf16) mask = round_to_bf16(mask);
    float* out = logits.data() + i * V;
    std::fill(out, out + V, mask);
    for (int64_t j = 0; j < top_k * per_cluster; ++j)
      out[token_ordering_[clusters[j / per_cluster] * per_cluster + j % per_cluster]] = selected[j];
  }
  return logits;
}

std::vector<int32_t> Gemma4Assistant::draft(std::span<const float> target_hidden, int32_t next,
                                            const KvCache& context, int64_t k, std::vector<float>* logits) const {
  const int64_t position = context.length();
  std::vector<float> state(target_hidden.begin(), target_hidden.end());
  std::vector<int32_t> drafts;
  if (logits) logits->clear();
  for (int32_t token = next; static_cast<int64_t>(drafts.size()) < k;) {
    AssistantStep s = step(std::span(&token, 1), state, std::span(&position, 1), context);
    token = s.tokens[0];
    drafts.push_back(token);
    state = std::move(s.states);
    if (logits) logits->insert(logits->end(), s.logits.begin(), s.logits.end());
  }
  return drafts;
}

}  // namespace qs
