#include "text/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"
#include "text/token_decoder.h"
#include "text/tokenizer_json.h"
#include "util/error.h"

namespace qs {

using text::json;
using text::JsonFields;

// The stages of one tokenizer.json, and the per-id tables they share.
struct Tokenizer::Impl {
  std::string source;  // file name for messages

  std::vector<std::string> pieces;  // model.vocab strings by id ("" where none); added tokens beyond it too
  text::BpeModel model{&pieces};
  text::AddedVocabulary added;
  text::Normalizer normalizer;
  text::PreTokenizer pre_tokenizer;
  text::TokenDecoder decoder;

  // Per id (size = vocab_size()). What tokenizers' id_to_token returns is pieces[id], except for added tokens whose
  // string differs from the vocabulary's (a normalized added token's normalized form): piece_override.
  enum : uint8_t { kValid = 1, kSpecial = 2, kSkipped = 4, kOverride = 8, kModel = 16 };
  std::vector<uint8_t> id_flags;
  std::unordered_map<int32_t, std::string> piece_override;
  const std::string& piece(int32_t id) const {
    return (id_flags[id] & kOverride) ? piece_override.find(id)->second : pieces[id];
  }

  void build(text::TokenizerJson& file, const JsonFields& fields);
  std::vector<int32_t> encode(std::string_view text) const;

 private:
  int64_t load_vocab(std::vector<std::pair<std::string, int32_t>>& vocab, const JsonFields& fields);
  void build_id_tables(int64_t max_id);
};

// ---------------------------------------------------------------------------------------------------------------
// Loading

void Tokenizer::Impl::build(text::TokenizerJson& file, const JsonFields& fields) {
  const json& root = file.root;
  if (!root.is_object()) fields.fail("expected a JSON object at the top level");
  if (const json* v = JsonFields::member(root, "version"); v && !v->is_null() && (!v->is_string() || *v != "1.0"))
    fields.fail(fmt::format("version is {}, expected \"1.0\"", v->dump()));

  model.parse_options(file, fields);
  int64_t max_id = load_vocab(file.vocab, fields);
  file.vocab = {};
  model.build_tables(pieces);
  model.add_merges(file.merges, fields);
  file.merges = {};

  normalizer = text::Normalizer::parse(JsonFields::member(root, "normalizer"), fields);
  pre_tokenizer = text::PreTokenizer::parse(JsonFields::member(root, "pre_tokenizer"), fields);
  decoder = text::TokenDecoder::parse(JsonFields::member(root, "decoder"), fields);
  added.parse(JsonFields::member(root, "added_tokens"), model.vocab, fields, max_id);
  build_id_tables(max_id);
}

// model.vocab into `pieces`; returns the largest id.
int64_t Tokenizer::Impl::load_vocab(std::vector<std::pair<std::string, int32_t>>& vocab, const JsonFields& fields) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max<int64_t>(max_id, id);
  if (max_id >= 2 * static_cast<int64_t>(vocab.size()) + 65536)
    fields.fail(fmt::format("model.vocab: ids go up to {} for {} entries; expected ids 0..{} (a vocabulary this sparse "
                            "is not supported)", max_id, vocab.size(), vocab.size() - 1));
  pieces.resize(static_cast<size_t>(max_id + 1));
  id_flags.assign(pieces.size(), 0);
  model.vocab.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    if (id_flags[id] & kValid) {
      if (pieces[id] == tok) continue;
      fields.fail(fmt::format("model.vocab: id {} is given to both \"{}\" and \"{}\"", id, pieces[id], tok));
    }
    pieces[id] = std::move(tok);
    id_flags[id] = kValid | kModel;
    int32_t before = model.vocab.assign(pieces[id], id);  // a repeated key: the last one wins, like serde
    if (before >= 0) id_flags[before] = 0, pieces[before].clear();
  }
  return max_id;
}

// Added tokens' strings and flags, and the added-token matchers.
void Tokenizer::Impl::build_id_tables(int64_t max_id) {
  std::unordered_set<std::string> special_contents;
  for (const auto& a : added.tokens)
    if (a.special) special_contents.insert(a.content);

  pieces.resize(static_cast<size_t>(max_id + 1));
  id_flags.resize(pieces.size(), 0);
  const std::vector<std::string> added_pieces = added.build_matchers(normalizer);
  for (size_t i = 0; i < added.tokens.size(); ++i) {
    const text::AddedToken& a = added.tokens[i];
    const std::string& piece = added_pieces[i];
    uint8_t& f = id_flags[a.id];
    if (!(f & kModel)) {
      pieces[a.id] = piece;
    } else if (pieces[a.id] != piece) {
      piece_override[a.id] = piece;
      f |= kOverride;
    }
    f |= kValid | (a.special ? kSpecial : 0);
  }
  for (size_t id = 0; id < pieces.size(); ++id)
    if ((id_flags[id] & kValid) && special_contents.count(piece(static_cast<int32_t>(id)))) id_flags[id] |= kSkipped;
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source_name) {
  auto impl = std::make_shared<Impl>();
  impl->source = source_name;
  const JsonFields fields(source_name);
  text::TokenizerJson file = text::read_tokenizer_json(json_text, fields);
  impl->build(file, fields);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  std::ifstream f(tokenizer_json, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open tokenizer file", tokenizer_json.string()));
  std::string text;
  f.seekg(0, std::ios::end);
  auto size = f.tellg();
  if (size > 0) {
    text.resize(static_cast<size_t>(size));
    f.seekg(0);
    f.read(text.data(), size);
  }
  if (!f) throw Error(fmt::format("{}: cannot read tokenizer file", tokenizer_json.string()));
  return from_json(text, tokenizer_json.string());
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding: added tokens in the raw text, normalizer, added tokens in the normalized text, pre-tokenizer, BPE.

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  std::string normalized;
  std::vector<std::string_view> words;
  for (const text::AddedSplit& raw : added.split(text, added.raw_trie)) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    normalizer.normalize(text.substr(raw.begin, raw.end - raw.begin), normalized);
    for (const text::AddedSplit& part : added.split(normalized, added.normalized_trie)) {
      if (part.id >= 0) {
        out.push_back(part.id);
        continue;
      }
      pre_tokenizer.split(std::string_view(normalized).substr(part.begin, part.end - part.begin), words);
      for (std::string_view w : words) model.tokenize(w, out);
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const { return impl_->encode(text); }

// ---------------------------------------------------------------------------------------------------------------
// Decoding: ids -> pieces here, pieces -> text in text::DecoderState (shared by decode() and StreamDecoder).

struct StreamDecoder::State {
  explicit State(const Tokenizer::Impl* i) : impl(i), decoder(&i->decoder) {}

  const Tokenizer::Impl* impl;
  text::DecoderState decoder;

  void push_id(int32_t id, bool skip_special) {
    if (id < 0 || static_cast<size_t>(id) >= impl->pieces.size()) return;
    uint8_t f = impl->id_flags[id];
    if (!(f & Tokenizer::Impl::kValid)) return;
    if (skip_special && (f & Tokenizer::Impl::kSkipped)) return;
    decoder.push(impl->piece(id));
  }
};

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  StreamDecoder::State st(impl_.get());
  st.decoder.out.reserve(ids.size() * 4);
  for (int32_t id : ids) st.push_id(id, skip_special_tokens);
  st.decoder.finish();
  return std::move(st.decoder.out);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                             std::span<const std::string_view> kept_special)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens), state_(std::make_unique<State>(impl_.get())) {
  for (std::string_view piece : kept_special)
    if (auto id = tokenizer.token_id(piece)) kept_special_.push_back(*id);
}
StreamDecoder::~StreamDecoder() = default;
StreamDecoder::StreamDecoder(StreamDecoder&&) noexcept = default;
StreamDecoder& StreamDecoder::operator=(StreamDecoder&&) noexcept = default;

std::string StreamDecoder::push(int32_t id) {
  state_->decoder.out.clear();
  const bool kept = std::find(kept_special_.begin(), kept_special_.end(), id) != kept_special_.end();
  state_->push_id(id, skip_special_ && !kept);
  return std::move(state_->decoder.out);
}

std::string StreamDecoder::flush() {
  state_->decoder.out.clear();
  state_->decoder.finish();
  return std::move(state_->decoder.out);
}

// ---------------------------------------------------------------------------------------------------------------
// Lookups

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added.ids.find(token); it != impl_->added.ids.end()) return it->second;
  if (int32_t id = impl_->model.vocab.find(token); id >= 0) return id;
  return std::nullopt;
}

const std::string& Tokenizer::token_piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->pieces.size() || !(impl_->id_flags[id] & Impl::kValid))
    throw Error(fmt::format("{}: token id {} is not in the vocabulary (size {})", impl_->source, id,
                            impl_->pieces.size()));
  return impl_->piece(id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->pieces.size() && (impl_->id_flags[id] & Impl::kSpecial);
}

size_t Tokenizer::vocab_size() const { return impl_->pieces.size(); }
size_t Tokenizer::model_vocab_size() const { return impl_->model.vocab.size(); }

void Tokenizer::clear_cache() const { impl_->model.clear_cache(); }

}  // namespace qs
