#pragma once
// The decoder of a tokenizer.json (tokenizers' `decoders`): Replace with a literal pattern, ByteFallback, Fuse,
// Strip and Sequence, turning token pieces back into text; with no decoder, pieces are joined with spaces.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/tokenizer_json.h"

namespace qs::text {

class TokenDecoder {
 public:
  // Reads the "decoder" object (null: none); other decoder types are refused through `fields`.
  static TokenDecoder parse(const json* decoder, const JsonFields& fields);

  struct Step {
    enum Kind { kReplace, kByteFallback, kStrip } kind;
    std::string pattern, content;  // Replace
    uint32_t strip_char = 0;       // Strip
    size_t start = 0, stop = 0;
  };
  // Per-token steps before the first Fuse, character-stream steps after it.
  bool has_decoder = false;
  std::vector<Step> token_steps, stream_steps;

 private:
  void parse_step(const json& n, const std::string& where, const JsonFields& fields, bool& fused);
};

// Decoding: one state machine serves decode() and StreamDecoder, so streaming output always adds up to decode().
// Text that is final is appended to `out`; what a later token can still change (a run of byte tokens, a possible
// start of a Replace pattern, trailing Strip characters) is held until then or finish().
class DecoderState {
 public:
  explicit DecoderState(const TokenDecoder* decoder);

  // One token's piece.
  void push(std::string piece) { token(0, std::move(piece)); }
  // Ends the sequence: everything held goes out (Strip's trailing characters are dropped); then starts afresh.
  void finish();

  std::string out;

 private:
  struct StreamStep {
    std::string pending;       // Replace: a tail that may start a match
    size_t lead_stripped = 0;  // Strip
    bool past_lead = false;    // Strip
    size_t held = 0;           // Strip: trailing strip characters held back
  };

  void reset();
  void chars(size_t k, std::string_view text);
  void replace_chars(size_t k, std::string_view text);
  void strip_chars(size_t k, std::string_view text);
  void finish_chars();
  void token(size_t k, std::string tok);
  void flush_bytes(size_t k);

  const TokenDecoder* decoder_;
  std::vector<std::string> byte_runs_;  // per token step (ByteFallback steps buffer a run of bytes)
  std::vector<StreamStep> stream_;
  bool first_token_ = true;
};

}  // namespace qs::text
