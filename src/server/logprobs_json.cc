#include "server/logprobs_json.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {

using ojson = nlohmann::ordered_json;

namespace {

// UTF-8 characters in `s` (a stray continuation byte counts as nothing, a stray lead byte as one).
int64_t utf8_length(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string token_text(int32_t id, const LogprobOptions& options, const Tokenizer& tokenizer) {
  if (options.tokens_as_ids) return fmt::format("token_id:{}", id);
  return tokenizer.decode(std::span(&id, 1), /*skip_special_tokens=*/false);
}

// The bytes a token stands for: a byte-fallback token <0xAB> is that one byte, anything else its text.
ojson token_bytes(int32_t id, const std::string& text, const Tokenizer& tokenizer) {
  ojson bytes = ojson::array();
  try {
    const std::string& piece = tokenizer.token_piece(id);
    if (piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>') {
      unsigned value = 0;
      auto [end, ec] = std::from_chars(piece.data() + 3, piece.data() + 5, value, 16);
      if (ec == std::errc() && end == piece.data() + 5) {
        bytes.push_back(value);
        return bytes;
      }
    }
  } catch (const Error&) {
  }
  for (unsigned char c : text) bytes.push_back(c);
  return bytes;
}

// OpenAI writes -inf as -9999.
double finite_logprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

}  // namespace

ojson chat_logprobs(std::span<const SampledToken> tokens, const LogprobOptions& options, const Tokenizer& tokenizer) {
  ojson content = ojson::array();
  for (const SampledToken& t : tokens) {
    ojson entry;
    std::string text = token_text(t.id, options, tokenizer);
    entry["token"] = text;
    entry["logprob"] = finite_logprob(t.logprob);
    entry["bytes"] = token_bytes(t.id, text, tokenizer);
    ojson top = ojson::array();
    for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int32_t>(k) < options.top; ++k) {
      const auto& [id, lp] = t.top_logprobs[k];
      std::string alt = token_text(id, options, tokenizer);
      ojson a;
      a["token"] = alt;
      a["logprob"] = finite_logprob(lp);
      a["bytes"] = token_bytes(id, alt, tokenizer);
      top.push_back(std::move(a));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  ojson out;
  out["content"] = std::move(content);
  return out;
}

ojson completion_logprobs(std::span<const SampledToken> tokens, const LogprobOptions& options,
                          const Tokenizer& tokenizer, int64_t& text_offset) {
  ojson texts = ojson::array(), logprobs = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const SampledToken& t : tokens) {
    std::string text = token_text(t.id, options, tokenizer);
    texts.push_back(text);
    logprobs.push_back(finite_logprob(t.logprob));
    // The top alternatives and, always, the sampled token (OpenAI: up to logprobs + 1 entries).
    ojson top = ojson::object();
    for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int32_t>(k) < options.top; ++k)
      top[token_text(t.top_logprobs[k].first, options, tokenizer)] = finite_logprob(t.top_logprobs[k].second);
    if (!top.contains(text)) top[text] = finite_logprob(t.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += utf8_length(text);
  }
  ojson out;
  out["tokens"] = std::move(texts);
  out["token_logprobs"] = std::move(logprobs);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

ojson echo_completion_logprobs(std::span<const int32_t> prompt, std::span<const SampledToken> prompt_scores,
                               std::span<const SampledToken> tokens, const LogprobOptions& options,
                               const Tokenizer& tokenizer, int64_t& text_offset) {
  std::vector<SampledToken> scored;
  scored.reserve(prompt.size());
  scored.push_back({prompt.front(), 0.0f, {}});
  scored.insert(scored.end(), prompt_scores.begin(), prompt_scores.end());
  ojson out = completion_logprobs(scored, options, tokenizer, text_offset);
  // The first prompt token follows nothing: no logprob and no alternatives (OpenAI's and vLLM's null).
  out["token_logprobs"][0] = nullptr;
  out["top_logprobs"][0] = nullptr;
  const ojson generated = completion_logprobs(tokens, options, tokenizer, text_offset);
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const auto& v : generated[key]) out[key].push_back(v);
  return out;
}

}  // namespace qs
