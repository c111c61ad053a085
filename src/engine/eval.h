#pragma once
// `qatserve eval`: perplexity of a model over a held-out text, and how far its next-token distributions are from
// a reference run's (the same model at another precision, or another checkpoint with the same tokenizer).
//
// Windows (exactly what transformers reproduces in tools/python/check_eval_external.py): the text's tokens are
// cut into consecutive, NON-overlapping chunks of `context` tokens (the last one shorter). Each chunk is one
// forward pass over BOS followed by the chunk minus its last token, so the logits at input position j predict
// chunk token j: every text token is scored exactly once, from BOS and the text tokens before it in its own chunk.
// No context carries across chunks (llama.cpp's perplexity scores only each chunk's second half, transformers'
// stride examples overlap windows; both give later tokens more context, so their perplexities are lower for the
// same context length).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qs {

class Gemma4Model;

// -log softmax(logits)[target] in nats, computed in double.
double next_token_nll(std::span<const float> logits, int32_t target);
// KL(reference || model) = sum_i p_ref(i) (log p_ref(i) - log p_model(i)), nats, of the softmaxes of two logit rows.
double kl_divergence(std::span<const float> reference, std::span<const float> logits);
// The first index of the largest logit (torch.argmax's choice on ties).
int64_t argmax(std::span<const float> logits);

// Negative log-likelihood summed over scored tokens.
struct PerplexityTotals {
  int64_t tokens = 0;
  double nll_sum = 0;
  void add(std::span<const float> logits, int32_t target) { nll_sum += next_token_nll(logits, target), ++tokens; }
  double mean_nll() const { return tokens ? nll_sum / tokens : 0; }
  double perplexity() const;  // exp(mean_nll)
};

// Model against reference, position by position, over every vocabulary entry.
struct ComparisonTotals {
  int64_t positions = 0, top1_agree = 0;
  double kl_sum = 0, max_kl = 0, max_abs_logit_diff = 0;
  void add(std::span<const float> reference, std::span<const float> logits);
  double mean_kl() const { return positions ? kl_sum / positions : 0; }
  double top1_agreement() const { return positions ? double(top1_agree) / positions : 0; }
};

// Text tokens [begin, end) scored by one forward pass.
struct EvalWindow {
  int64_t begin = 0, end = 0;
};
std::vector<EvalWindow> eval_windows(int64_t text_tokens, int64_t context);
// The forward pass's input for a window: BOS, then the window's tokens but its last.
std::vector<int32_t> eval_window_input(std::span<const int32_t> text, EvalWindow w, int32_t bos);

// Token ids from a file: non-negative integers separated by commas and/or whitespace (no BOS: eval adds it).
std::vector<int32_t> read_token_file(const std::filesystem::path& path);

struct EvalOptions {
  int64_t context = 2048;
  int32_t bos_token_id = 2;
  // Positions per forward call within a window (the KV cache carries the window across calls): bounds the logits
  // held at once to chunk x vocab floats per model (256 x 262144 x 4 B = 256 MiB for Gemma 4).
  int64_t chunk = 256;
};

struct EvalReport {
  int64_t context = 0, windows = 0;
  PerplexityTotals model;
  std::optional<PerplexityTotals> reference;
  std::optional<ComparisonTotals> comparison;
  double seconds = 0;
};

// Runs every window through `model` (and `reference` when given: same vocabulary required) and accumulates.
// `progress` gets a line at most every second and one when done.
EvalReport run_eval(std::span<const int32_t> text, const Gemma4Model& model, const Gemma4Model* reference,
                    const EvalOptions& o, const std::function<void(const std::string&)>& progress);

// Labels of the two runs for the report (e.g. "DIR (bf16 activations, int4 weights)").
struct EvalLabels {
  std::string model, reference;
};
std::string format_eval_report(const EvalReport& r, const EvalLabels& labels);
nlohmann::json eval_report_json(const EvalReport& r, const EvalLabels& labels);

}  // namespace qs
