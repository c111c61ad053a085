#pragma once
// A checkpoint's generation_config.json: the special token ids generation needs and the sampling defaults a request
// starts from (each request field, when given, overrides them).
//
// Missing file: Gemma 4's released values (every published Gemma 4 generation_config.json carries them).
// Present file: each field present is used; an absent sampling field is neutral (temperature 1, no top-k, top_p 1,
// min_p 0, repetition_penalty 1), as vLLM reads the file; absent token ids keep Gemma 4's. do_sample false means
// greedy, as transformers reads it (vLLM ignores do_sample).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/sampler.h"

namespace qs {

struct GenerationConfig {
  int32_t bos_token_id = 2;
  int32_t pad_token_id = 0;
  std::vector<int32_t> eos_token_ids;  // generation stops on any of them
  bool do_sample = true;
  float temperature = 1.0f;
  int32_t top_k = 0;  // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<int64_t> max_new_tokens;

  bool is_eos(int32_t id) const;
  // What a request samples with unless it says otherwise.
  SamplingParams default_sampling() const;
};

// bos 2, pad 0, eos {1 <eos>, 106 <turn|>, 50 <|tool_response>}, do_sample, temperature 1.0, top_k 64, top_p 0.95.
GenerationConfig gemma4_release_generation_config();

// Throws qs::Error naming `label` and the field for wrong types or out-of-range sampling values.
GenerationConfig parse_generation_config(std::string_view json_text, std::string_view label);

// checkpoint_dir/generation_config.json, or gemma4_release_generation_config() when there is no such file.
GenerationConfig read_generation_config(const std::filesystem::path& checkpoint_dir);

}  // namespace qs
