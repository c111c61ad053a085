#include "text/token_decoder.h"

#include <fmt/format.h>

#include <algorithm>

#include "text/normalizer.h"
#include "text/utf8.h"

namespace qs::text {
namespace {

const std::string kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// tokenizers' ByteFallback test: a piece of exactly 6 bytes "<0x" HH ">" where HH parses as u8 in base 16
// (Rust's from_str_radix, which also takes a leading '+').
int byte_token_value(std::string_view piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (piece[3] == '+') return hex(piece[4]);
  int hi = hex(piece[3]), lo = hex(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Loading

TokenDecoder TokenDecoder::parse(const json* decoder, const JsonFields& fields) {
  TokenDecoder out;
  bool fused = false;
  if (decoder) out.parse_step(*decoder, "decoder", fields, fused);
  return out;
}

void TokenDecoder::parse_step(const json& n, const std::string& where, const JsonFields& fields, bool& fused) {
  if (n.is_null()) return;
  has_decoder = true;
  std::string type = fields.type_of(n, where);
  auto& steps = fused ? stream_steps : token_steps;
  if (type == "Sequence") {
    const json* list = JsonFields::member(n, "decoders");
    if (!list || !list->is_array()) fields.fail(where + ".decoders must be an array");
    for (size_t i = 0; i < list->size(); ++i)
      parse_step((*list)[i], fmt::format("{}.decoders[{}]", where, i), fields, fused);
  } else if (type == "Replace") {
    Step s{Step::kReplace, fields.literal_pattern(n, where), fields.get_string(n, "content", where)};
    steps.push_back(std::move(s));
  } else if (type == "ByteFallback") {
    if (fused) fields.fail(where + ": ByteFallback after Fuse is not supported");
    steps.push_back({Step::kByteFallback, "", ""});
  } else if (type == "Fuse") {
    fused = true;
  } else if (type == "Strip") {
    std::string c = fields.get_string(n, "content", where);
    auto cps = code_points(c);
    if (cps.size() != 1) fields.fail(where + ".content must be one character");
    Step s{Step::kStrip, "", ""};
    s.strip_char = cps[0];
    auto count = [&](const char* k) {
      const json* v = JsonFields::member(n, k);
      if (!v || !v->is_number_unsigned()) fields.fail(fmt::format("{}.{} must be a non-negative integer", where, k));
      return v->get<size_t>();
    };
    s.start = count("start");
    s.stop = count("stop");
    steps.push_back(std::move(s));
  } else {
    fields.fail(fmt::format("{}: decoder type \"{}\" is not supported (Replace with a String pattern, ByteFallback, "
                            "Fuse, Strip, Sequence)", where, type));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Decoding

DecoderState::DecoderState(const TokenDecoder* decoder)
    : decoder_(decoder), byte_runs_(decoder->token_steps.size()), stream_(decoder->stream_steps.size()) {}

void DecoderState::reset() {
  for (auto& r : byte_runs_) r.clear();
  for (auto& s : stream_) s = StreamStep{};
  first_token_ = true;
}

// Characters after Fuse, through stream step `k` onwards.
void DecoderState::chars(size_t k, std::string_view text) {
  if (text.empty()) return;
  if (k == decoder_->stream_steps.size()) {
    out.append(text);
    return;
  }
  if (decoder_->stream_steps[k].kind == TokenDecoder::Step::kReplace) replace_chars(k, text);
  else strip_chars(k, text);
}

void DecoderState::replace_chars(size_t k, std::string_view text) {
  const auto& step = decoder_->stream_steps[k];
  StreamStep& st = stream_[k];
  st.pending.append(text);
  const std::string& pat = step.pattern;
  std::string emit;
  size_t i = 0;
  while (i < st.pending.size()) {
    if (st.pending.compare(i, pat.size(), pat) == 0) {
      emit += step.content;
      i += pat.size();
    } else if (st.pending.size() - i < pat.size() &&
               pat.compare(0, st.pending.size() - i, st.pending, i, std::string::npos) == 0) {
      break;  // could still become a match
    } else {
      emit += st.pending[i++];
    }
  }
  st.pending.erase(0, i);
  chars(k + 1, emit);
}

// Strip on the fused text: up to `start` leading and `stop` trailing strip characters.
void DecoderState::strip_chars(size_t k, std::string_view text) {
  const auto& step = decoder_->stream_steps[k];
  StreamStep& st = stream_[k];
  std::string emit;
  std::string c;
  append_utf8(c, step.strip_char);
  for (uint32_t cp : code_points(text)) {
    if (!st.past_lead) {
      if (st.lead_stripped < step.start && cp == step.strip_char) {
        ++st.lead_stripped;
        continue;
      }
      st.past_lead = true;
    }
    if (step.stop > 0 && cp == step.strip_char) {
      if (++st.held > step.stop) emit += c, --st.held;
      continue;
    }
    for (; st.held > 0; --st.held) emit += c;
    append_utf8(emit, cp);
  }
  chars(k + 1, emit);
}

void DecoderState::finish_chars() {
  for (size_t k = 0; k < decoder_->stream_steps.size(); ++k) {
    StreamStep& st = stream_[k];
    if (decoder_->stream_steps[k].kind == TokenDecoder::Step::kReplace) {
      std::string rest = std::move(st.pending);
      st.pending.clear();
      chars(k + 1, rest);
    }
    // Strip: held trailing characters are dropped.
    st.held = 0;
  }
}

// A token through token step `k` onwards.
void DecoderState::token(size_t k, std::string tok) {
  if (k == decoder_->token_steps.size()) {
    if (!decoder_->has_decoder) {
      if (!first_token_) out += ' ';
      out += tok;
    } else {
      chars(0, tok);
    }
    first_token_ = false;
    return;
  }
  const auto& step = decoder_->token_steps[k];
  switch (step.kind) {
    case TokenDecoder::Step::kReplace:
      if (tok.find(step.pattern) != std::string::npos) tok = replace_all(tok, step.pattern, step.content);
      token(k + 1, std::move(tok));
      return;
    case TokenDecoder::Step::kStrip: {
      auto cps = code_points(tok);
      size_t b = 0, e = cps.size();
      while (b < std::min(step.start, cps.size()) && cps[b] == step.strip_char) ++b;
      for (size_t i = 0; i < step.stop && e > b && cps[e - 1] == step.strip_char; ++i) --e;
      std::string s;
      for (size_t i = b; i < e; ++i) append_utf8(s, cps[i]);
      token(k + 1, std::move(s));
      return;
    }
    case TokenDecoder::Step::kByteFallback: {
      int v = byte_token_value(tok);
      if (v >= 0) {
        byte_runs_[k] += static_cast<char>(v);
        return;
      }
      flush_bytes(k);
      token(k + 1, std::move(tok));
      return;
    }
  }
}

// tokenizers' ByteFallback turns a whole run of byte tokens into U+FFFDs, one per byte, when it is not valid UTF-8.
void DecoderState::flush_bytes(size_t k) {
  if (byte_runs_[k].empty()) return;
  std::string run = std::move(byte_runs_[k]);
  byte_runs_[k].clear();
  if (valid_utf8(run)) {
    token(k + 1, std::move(run));
  } else {
    for (size_t i = 0; i < run.size(); ++i) token(k + 1, kReplacementChar);
  }
}

void DecoderState::finish() {
  for (size_t k = 0; k < decoder_->token_steps.size(); ++k)
    if (decoder_->token_steps[k].kind == TokenDecoder::Step::kByteFallback) flush_bytes(k);
  finish_chars();
  reset();
}

}  // namespace qs::text
