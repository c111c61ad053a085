#include "engine/eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "model/gemma4.h"
#include "util/error.h"
#include "util/interrupt.h"

namespace qs {

namespace {

// log(sum exp(x)), shifted by the maximum so no term overflows; in double so a 262144-term sum loses nothing.
double log_sum_exp(std::span<const float> x) {
  float peak = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double(v) - peak);
  return peak + std::log(sum);
}

}  // namespace

double next_token_nll(std::span<const float> logits, int32_t target) {
  return log_sum_exp(logits) - logits[target];
}

double kl_divergence(std::span<const float> reference, std::span<const float> logits) {
  double lse_ref = log_sum_exp(reference), lse = log_sum_exp(logits), kl = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    double log_p_ref = reference[i] - lse_ref, log_p = logits[i] - lse;
    kl += std::exp(log_p_ref) * (log_p_ref - log_p);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical rows; KL is never negative
}

int64_t argmax(std::span<const float> logits) {
  return std::max_element(logits.begin(), logits.end()) - logits.begin();
}

double PerplexityTotals::perplexity() const { return std::exp(mean_nll()); }

void ComparisonTotals::add(std::span<const float> reference, std::span<const float> logits) {
  double kl = kl_divergence(reference, logits);
  kl_sum += kl;
  max_kl = std::max(max_kl, kl);
  top1_agree += argmax(reference) == argmax(logits);
  for (size_t i = 0; i < reference.size(); ++i)
    max_abs_logit_diff = std::max(max_abs_logit_diff, double(std::fabs(reference[i] - logits[i])));
  ++positions;
}

std::vector<EvalWindow> eval_windows(int64_t text_tokens, int64_t context) {
  if (context < 1) throw Error(fmt::format("--context: {} is not a positive number of tokens", context));
  std::vector<EvalWindow> windows;
  for (int64_t begin = 0; begin < text_tokens; begin += context)
    windows.push_back({begin, std::min(begin + context, text_tokens)});
  return windows;
}

std::vector<int32_t> eval_window_input(std::span<const int32_t> text, EvalWindow w, int32_t bos) {
  std::vector<int32_t> input{bos};
  input.insert(input.end(), text.begin() + w.begin, text.begin() + w.end - 1);
  return input;
}

std::vector<int32_t> read_token_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot read the token file", path.string()));
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream items(text);
  std::vector<int32_t> ids;
  for (std::string item; items >> item;) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      throw Error(fmt::format("{}: item {} '{}' is not a token id (expected non-negative integers separated by "
                              "commas or whitespace)", path.string(), ids.size() + 1, item));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error(fmt::format("{}: no token ids", path.string()));
  return ids;
}

namespace {

void check_inputs(std::span<const int32_t> text, const Gemma4Model& model, const Gemma4Model* reference,
                  const EvalOptions& o) {
  int64_t vocab = model.config().text.vocab_size;
  if (text.empty()) throw Error("eval: the text has no tokens to score");
  if (reference && reference->config().text.vocab_size != vocab)
    throw Error(fmt::format("eval: the reference model's vocabulary has {} entries, the model's {}: they must share "
                            "a tokenizer", reference->config().text.vocab_size, vocab));
  if (o.bos_token_id < 0 || o.bos_token_id >= vocab)
    throw Error(fmt::format("eval: BOS id {} is outside the vocabulary ({} entries)", o.bos_token_id, vocab));
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] >= vocab)
      throw Error(fmt::format("eval: token {} of the text (counting from 1) is id {}, outside the model's "
                              "vocabulary ({} entries)", i + 1, text[i], vocab));
}

// One window: a chunk of positions per forward call through the model (and the reference beside it, each with its
// own KV cache, so only one chunk of each model's logits is resident), the logits at input position p predicting
// text token window.begin + p. `after_chunk` runs after each forward call (progress).
void score_window(std::span<const int32_t> text, EvalWindow window, const Gemma4Model& model,
                  const Gemma4Model* reference, const EvalOptions& o, EvalReport& r,
                  const std::function<void()>& after_chunk) {
  const int64_t vocab = model.config().text.vocab_size;
  auto row = [vocab](const std::vector<float>& logits, int64_t i) {
    return std::span<const float>(logits).subspan(i * vocab, vocab);
  };
  std::vector<int32_t> input = eval_window_input(text, window, o.bos_token_id);
  auto positions = static_cast<int64_t>(input.size());
  KvCache cache = model.new_cache(positions);
  std::optional<KvCache> reference_cache;
  if (reference) reference_cache.emplace(reference->new_cache(positions));
  for (int64_t first = 0; first < positions; first += o.chunk) {
    throw_if_interrupted();
    auto part = std::span<const int32_t>(input).subspan(first, std::min(o.chunk, positions - first));
    std::vector<float> logits = model.forward(part, cache, /*all_logits=*/true), reference_logits;
    if (reference) reference_logits = reference->forward(part, *reference_cache, /*all_logits=*/true);
    for (int64_t i = 0; i < static_cast<int64_t>(part.size()); ++i) {
      int32_t target = text[window.begin + first + i];
      r.model.add(row(logits, i), target);
      if (!reference) continue;
      r.reference->add(row(reference_logits, i), target);
      r.comparison->add(row(reference_logits, i), row(logits, i));
    }
    after_chunk();
  }
}

}  // namespace

EvalReport run_eval(std::span<const int32_t> text, const Gemma4Model& model, const Gemma4Model* reference,
                    const EvalOptions& o, const std::function<void(const std::string&)>& progress) {
  check_inputs(text, model, reference, o);
  if (o.chunk < 1) throw Error(fmt::format("eval: chunk {} is not a positive number of positions", o.chunk));
  auto start = std::chrono::steady_clock::now(), last_line = start;
  EvalReport r;
  r.context = o.context;
  if (reference) r.reference.emplace(), r.comparison.emplace();
  auto windows = eval_windows(static_cast<int64_t>(text.size()), o.context);
  r.windows = static_cast<int64_t>(windows.size());
  for (size_t w = 0; w < windows.size(); ++w) {
    // A line at most every second (a window of a large model can take minutes), and one at the end.
    auto report_progress = [&, w] {
      auto now = std::chrono::steady_clock::now();
      if (now - last_line < std::chrono::seconds(1) && r.model.tokens < static_cast<int64_t>(text.size())) return;
      last_line = now;
      progress(fmt::format("eval: {}/{} tokens (window {}/{}), perplexity so far {:.4f}", r.model.tokens,
                           text.size(), w + 1, windows.size(), r.model.perplexity()));
    };
    score_window(text, windows[w], model, reference, o, r, report_progress);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string format_eval_report(const EvalReport& r, const EvalLabels& labels) {
  std::string out = fmt::format("model: {}\n{} tokens scored in {} non-overlapping windows of {} (BOS + the window "
                                "minus its last token per forward pass), {:.1f} s\n",
                                labels.model, r.model.tokens, r.windows, r.context, r.seconds);
  out += fmt::format("perplexity {:.6f} (mean negative log-likelihood {:.6f} nats)\n", r.model.perplexity(),
                     r.model.mean_nll());
  if (!r.comparison) return out;
  const ComparisonTotals& c = *r.comparison;
  out += fmt::format("reference: {}\nreference perplexity {:.6f} (mean negative log-likelihood {:.6f} nats)\n",
                     labels.reference, r.reference->perplexity(), r.reference->mean_nll());
  out += fmt::format("against the reference, over {} positions: mean KL(reference || model) {:.6g} nats (max {:.6g}), "
                     "top-1 agreement {}/{} ({:.2f}%), largest |logit difference| {:.6g}\n",
                     c.positions, c.mean_kl(), c.max_kl, c.top1_agree, c.positions, 100 * c.top1_agreement(),
                     c.max_abs_logit_diff);
  return out;
}

nlohmann::json eval_report_json(const EvalReport& r, const EvalLabels& labels) {
  nlohmann::json j = {
      {"model", labels.model},
      {"context", r.context},
      {"windows", r.windows},
      {"windowing", "non-overlapping: each window of `context` text tokens is one forward pass over BOS + the window "
                    "minus its last token; every text token scored once"},
      {"tokens_scored", r.model.tokens},
      {"mean_nll", r.model.mean_nll()},
      {"perplexity", r.model.perplexity()},
      {"seconds", r.seconds},
  };
  if (r.comparison) {
    const ComparisonTotals& c = *r.comparison;
    j["reference"] = {{"model", labels.reference},
                      {"mean_nll", r.reference->mean_nll()},
                      {"perplexity", r.reference->perplexity()}};
    j["comparison"] = {{"positions", c.positions},
                       {"mean_kl", c.mean_kl()},
                       {"max_kl", c.max_kl},
                       {"top1_agree", c.top1_agree},
                       {"top1_agreement", c.top1_agreement()},
                       {"max_abs_logit_diff", c.max_abs_logit_diff}};
  }
  return j;
}

}  // namespace qs
