// libFuzzer target: the tokenizer (src/text/tokenizer.* and the stages it composes, beside it in src/text/).
// The first byte picks what the rest is:
//   0: text to encode with the demo tokenizer (configs/demo-tokenizer, or the tokenizer.json named by
//      $QATSERVE_FUZZ_TOKENIZER): ids are in the vocabulary, the same with a cold word cache, and decode to the
//      text again when it is valid UTF-8 without "▁" (the normalizer writes spaces as "▁");
//   1: little-endian int32 ids to decode (any value): streaming decoding equals decode();
//   2: tokenizer.json text: loading throws a qs::Error naming the file, or gives a tokenizer that encodes and
//      decodes its own text without failing.
// In modes 0 and 1 StreamDecoder's pieces, with and without special tokens, concatenate to decode()'s text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "util/error.h"

namespace {

const qs::Tokenizer& fuzzed_tokenizer() {
  static const qs::Tokenizer tokenizer = [] {
    const char* path = std::getenv("QATSERVE_FUZZ_TOKENIZER");
    return qs::Tokenizer::load(path ? path : QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/tokenizer.json");
  }();
  return tokenizer;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 2) return false;
      cp = cp << 6 | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

void check_stream_decoding(const qs::Tokenizer& t, const std::vector<int32_t>& ids) {
  for (bool skip : {false, true}) {
    qs::StreamDecoder stream(t, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (streamed != t.decode(ids, skip)) std::abort();
  }
}

void check_text(const qs::Tokenizer& t, std::string_view text) {
  std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= t.vocab_size()) std::abort();
  t.clear_cache();
  if (t.encode(text) != ids) std::abort();
  if (valid_utf8(text) && text.find("\u2581") == std::string_view::npos && t.decode(ids) != text) {
    std::fprintf(stderr, "decode(encode(text)) != text\n");
    std::abort();
  }
  check_stream_decoding(t, ids);
}

void check_ids(const qs::Tokenizer& t, std::string_view bytes) {
  std::vector<int32_t> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  check_stream_decoding(t, ids);
}

void check_load(std::string_view json_text) {
  const std::string name = "fuzz/tokenizer.json";
  try {
    qs::Tokenizer t = qs::Tokenizer::from_json(json_text, name);
    std::vector<int32_t> ids = t.encode(json_text);
    (void)t.decode(ids);
    for (int32_t id : ids) (void)t.token_piece(id);
  } catch (const qs::Error& e) {
    if (std::string_view(e.what()).substr(0, name.size()) != name) {
      std::fprintf(stderr, "error does not name the file: %s\n", e.what());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: check_text(fuzzed_tokenizer(), rest); break;
    case 1: check_ids(fuzzed_tokenizer(), rest); break;
    case 2: check_load(rest); break;
  }
  return 0;
}
