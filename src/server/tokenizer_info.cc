#include "server/tokenizer_info.h"

#include "util/file.h"
#include "util/json_parse.h"

namespace qs {

using ojson = nlohmann::ordered_json;

ojson tokenizer_info(const std::filesystem::path& model_dir, int64_t max_context) {
  ojson info = ojson::object();
  const auto config = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    ojson read = read_json_file<ojson>(config);
    if (read.is_object()) info = std::move(read);
  }
  // The token table lives in tokenizer.json; vLLM leaves the decoder map out of this reply too.
  info.erase("added_tokens_decoder");
  if (!info.contains("tokenizer_class")) info["tokenizer_class"] = "PreTrainedTokenizerFast";
  const auto jinja = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) info["chat_template"] = read_file(jinja);
  // Not the checkpoint's nominal length (transformers writes a huge sentinel when unset): what a request may use.
  info["model_max_length"] = max_context;
  return info;
}

}  // namespace qs
