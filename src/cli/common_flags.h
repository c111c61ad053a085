// Flags several commands take, written once: precision and KV dtype, token ids, media URL fetching, speculative
// decoding.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/speculative_config.h"
#include "media/media_fetch.h"

namespace qs::cli {

inline constexpr const char* kPrecisionHelp =
    "bf16 (default), f32 (every activation in f32), or int8 (opt-in W4A8: the int4 linears take int8 activations; "
    "lossy, see `bench --precision int8` for its logit error)";

// --kv-dtype: f32, bf16 or int8.
void add_kv_dtype(CLI::App* cmd, std::string& kv_dtype);

// --tokens: comma-separated non-negative token ids.
std::vector<int32_t> parse_token_ids(const std::string& text);

// --allowed-media-domains and --media-fetch-timeout: image_url parts given as http(s) URLs (media/media_fetch.h).
struct MediaFetchFlags {
  std::string domains;
  double timeout_seconds = 10;

  void add_to(CLI::App* cmd);
  media::MediaFetchOptions options() const;
};

// Speculative decoding flags of generate, chat and serve (engine/speculative.h).
// bench takes a list of --num-speculative-tokens (one row each): token_list receives it.
void add_speculative_options(CLI::App* cmd, std::string& method, SpeculativeConfig& c, std::string& draft_model,
                             std::string& assistant, std::string* token_list = nullptr);

// --speculative, with --assistant meaning assistant and --draft-model draft_model unless a method is named.
SpeculativeConfig speculative_config_of(const std::string& method, SpeculativeConfig c, const std::string& draft_model,
                                        const std::string& assistant);

}  // namespace qs::cli
