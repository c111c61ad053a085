// libFuzzer target: arbitrary bytes as config.json text. parse_model_config (and parse_audio_config, when there is
// an audio_config) must either throw qs::Error (naming the file) or return a config whose derived facts can be
// queried (per layer for the text model).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "formats/model_config.h"
#include "util/error.h"

namespace {

void expect_named(const qs::Error& e) {
  if (std::string_view(e.what()).substr(0, 17) != "fuzz/config.json:") {
    std::fprintf(stderr, "error does not name the file: %s\n", e.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  qs::ModelConfig m;
  try {
    m = qs::parse_model_config(text, "fuzz/config.json");
  } catch (const qs::Error& e) {
    expect_named(e);
    return 0;
  }
  const qs::Gemma4TextConfig& c = m.text;
  if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) std::abort();
  // An assistant drafter's layers all read its target's K/V: none of its own is their source.
  if (m.assistant && (c.num_kv_shared_layers != c.num_hidden_layers || m.assistant->backbone_hidden_size <= 0 ||
                      (m.assistant->use_ordered_embeddings && m.assistant->tokens_per_centroid(c.vocab_size) <= 0)))
    std::abort();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    int64_t src = c.kv_source(l);
    if (m.assistant ? src != -1 : (src < 0 || src > l || c.layer_types[src] != c.layer_types[l])) std::abort();
    if (c.layer_head_dim(l) <= 0 || c.layer_kv_heads(l) <= 0) std::abort();
  }
  (void)m.text_prefix();
  if (m.quantization) {
    (void)m.quantization->unsupported_reason();
    (void)m.quantization->group_size();
  }
  if (!m.has_audio) return 0;
  try {
    const qs::Gemma4AudioConfig a = qs::parse_audio_config(m, "fuzz/config.json");
    if (a.head_dim() <= 0 || a.context_size() <= 0 || a.projection_input() <= 0) std::abort();
  } catch (const qs::Error& e) {
    expect_named(e);
  }
  return 0;
}
