#pragma once
// Hugging Face `tokenizer.json` loader for BPE tokenizers as Gemma 3 / Gemma 4 use them, with the semantics of the
// Rust `tokenizers` library (0.23) reproduced exactly for every feature such a file can use:
//
//   encode:  1. added tokens with normalized=false are cut out of the raw text (leftmost-longest match; lstrip,
//               rstrip and single_word as the file sets them; special tokens are matched too, as by default);
//            2. each remaining piece is normalized (Replace with a literal pattern, Prepend, Sequence);
//            3. added tokens with normalized=true are cut out of the normalized pieces;
//            4. the pre-tokenizer splits what is left (Split on a literal pattern with any behavior, Sequence);
//            5. each pre-token goes through the BPE model: one symbol per character (a vocab char, else its bytes
//               as <0xXX> tokens when byte_fallback is set, else the unk token, fused when fuse_unk is set), then
//               merges applied lowest rank first, leftmost first among equal ranks.
//   decode:  ids -> pieces (unknown ids dropped, special tokens dropped on request), then the decoder chain
//            (Replace, ByteFallback, Fuse, Strip), concatenated; no decoder joins pieces with spaces.
//
// Anything in a tokenizer.json that this code cannot reproduce exactly (regex patterns, Unicode normalization
// forms, other model types, BPE dropout, ...) is refused at load time with a qs::Error naming the file and field.
// post_processor, truncation and padding are not applied: encode() is `add_special_tokens=False` on one text, and
// callers add BOS and handle lengths themselves.
// Text need not be valid UTF-8: a byte that does not start a valid character is its own symbol (byte fallback).
//
// Speed (one core): loading the 33 MB Gemma 3 file ~0.5 s (streaming SAX parse of vocab and merges); encoding
// ~8 MB/s on varied text with a cold word cache, ~20 MB/s warm. Pre-tokens are cut before each "▁" that no vocabulary
// entry can merge across (provably the same result as BPE on the whole pre-token), and those pieces are cached.
//
// Each stage has its own file beside this one, as the tokenizers library keeps them: normalizer, pre_tokenizer,
// bpe_model, added_tokens and token_decoder (tokenizer_json reads the file); tokenizer.cc composes them.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json; a missing, unreadable, malformed or unsupported file is a qs::Error whose
  // message starts with the path and names the offending field.
  static Tokenizer load(const std::filesystem::path& tokenizer_json);
  // The same from JSON text already in memory; `source_name` stands for the file name in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& source_name);

  // Token ids of `text`, as tokenizers' `encode(text, add_special_tokens=False)`: no BOS/EOS is added, but special
  // tokens written in the text (e.g. "<start_of_turn>") are recognised. Thread-safe (the word cache is shared).
  std::vector<int32_t> encode(std::string_view text) const;
  // Text of `ids`, as tokenizers' `decode(ids, skip_special_tokens)`: ids outside the vocabulary are dropped;
  // byte-fallback tokens are fused into UTF-8, a run of them that is not valid UTF-8 gives one U+FFFD per byte.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Id of an exact added-token or vocabulary string (added tokens first, as tokenizers' token_to_id).
  std::optional<int32_t> token_id(std::string_view token) const;
  // The string of an id (tokenizers' id_to_token); a qs::Error for an id that has none.
  const std::string& token_piece(int32_t id) const;
  // True for added tokens marked special (skipped by decode(..., true)); false for anything else or out of range.
  bool is_special(int32_t id) const;
  // One more than the largest id (vocabulary and added tokens): 262145 for Gemma 3 (<image_soft_token> = 262144
  // is an added token beyond the 262144-entry vocabulary), 262144 for Gemma 4.
  size_t vocab_size() const;
  // Number of entries in model.vocab (262144 for Gemma 3 and 4).
  size_t model_vocab_size() const;
  // Empties the shared cache of BPE results per word (for benchmarks; never needed for correctness).
  void clear_cache() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Incremental detokenizer for streaming: feed ids one at a time, get back only complete UTF-8 text, never a split
// character. The concatenation of every push() and the final flush() equals decode(all ids, skip_special_tokens)
// exactly. Because tokenizers' ByteFallback decoder turns a whole run of consecutive byte tokens into U+FFFDs when
// the run is not valid UTF-8, bytes are held until the run ends (a non-byte token arrives, or flush()).
// The decoder shares the tokenizer's data, so it stays valid even if the Tokenizer object goes away.
// `kept_special`: special tokens written even when skipping the others (the chat template's markers, which the
// tool-call and reasoning parser reads).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true,
                         std::span<const std::string_view> kept_special = {});
  ~StreamDecoder();
  StreamDecoder(StreamDecoder&&) noexcept;
  StreamDecoder& operator=(StreamDecoder&&) noexcept;

  // Text that became final with this id (often the piece itself; empty while byte tokens are pending).
  std::string push(int32_t id);
  // Everything still held back; the decoder can then start a new sequence.
  std::string flush();

  struct State;

 private:
  std::shared_ptr<const Tokenizer::Impl> impl_;
  bool skip_special_;
  std::vector<int32_t> kept_special_;
  std::unique_ptr<State> state_;
};

}  // namespace qs
