#include "engine/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "engine/stop_strings.h"
#include "model/gemma4.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

GenerationResult Generator::run(const GenerationRequest& req, const std::function<void(std::string_view)>& on_text) const {
  if (req.prompt.empty()) throw Error("prompt: at least one token is required");
  if (req.max_tokens < 1) throw Error(fmt::format("max_tokens must be at least 1, got {}", req.max_tokens));
  if (!req.stop.empty() && !tokenizer_) throw Error("stop: stop strings need the checkpoint's tokenizer.json");
  const int64_t limit = model_.config().text.max_position_embeddings_or(INT64_MAX);
  const int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  if (prompt_len >= limit)
    throw Error(fmt::format("prompt has {} tokens but the model's context is {} positions", prompt_len, limit));
  const int64_t max_tokens = std::min(req.max_tokens, limit - prompt_len);

  Sampler sampler(req.sampling);
  KvCache cache = model_.new_cache(prompt_len + max_tokens);
  std::optional<StreamDecoder> decoder;
  if (tokenizer_) decoder.emplace(*tokenizer_, /*skip_special_tokens=*/true);
  StopStringMatcher stops(req.stop);
  GenerationResult result;
  std::vector<int32_t> output;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result.text += piece;
    if (on_text) on_text(piece);
  };

  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = model_.forward(req.prompt, cache, /*all_logits=*/false);
  result.prefill_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  result.finish_reason = "length";
  for (int64_t step = 0; step < max_tokens; ++step) {
    SampledToken token = sampler.sample(logits, req.prompt, output);
    bool stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), token.id) != req.stop_token_ids.end();
    if (stop_id || (!req.ignore_eos && generation_.is_eos(token.id))) {
      result.finish_reason = "stop";
      break;
    }
    output.push_back(token.id);
    result.tokens.push_back(std::move(token));
    if (decoder) {
      StopScan scan = stops.push(decoder->push(output.back()));
      emit(scan.text);
      if (scan.stopped_by) {
        result.finish_reason = "stop";
        break;
      }
    }
    if (step + 1 < max_tokens) logits = model_.forward(std::span(&output.back(), 1), cache, false);
  }
  if (decoder && !stops.stopped()) {
    StopScan tail = stops.push(decoder->flush());
    emit(tail.text);
    if (!tail.stopped_by) emit(stops.finish());
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace qs
