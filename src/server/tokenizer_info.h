#pragma once
// GET /tokenizer_info as vLLM serves it and lm-evaluation-harness's RemoteTokenizer (tokenizer_backend=remote) reads
// it: the checkpoint's tokenizer_config.json (bos_token, eos_token, pad_token, ... as written there), its
// tokenizer_class, the chat template (chat_template.jinja, else tokenizer_config.json's), and model_max_length, the
// context this server gives a sequence. Read once at load; the tokens themselves come from POST /tokenize.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace qs {

nlohmann::ordered_json tokenizer_info(const std::filesystem::path& model_dir, int64_t max_context);

}  // namespace qs
