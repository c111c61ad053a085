// POST /tokenize and POST /detokenize bodies (openai_protocol.h), vLLM's: a prompt or chat messages in, token ids
// out, and back.
#include <fmt/format.h>

#include "server/openai_protocol.h"
#include "server/openai_request.h"
#include "server/request_fields.h"
#include "text/tokenizer.h"

namespace qs {

using json = nlohmann::json;
using namespace request_fields;

std::vector<int32_t> parse_tokenize_request(const json& body, const ServedModel& model) {
  if (find(body, "messages")) {
    ChatPrompt prompt = chat_prompt_from_body(body, model);
    if (!prompt.media.empty())
      bad("messages", fmt::format("{}: /tokenize counts text only; a media part's tokens depend on its decoding",
                                  prompt.media.front().where));
    return std::move(prompt.tokens);
  }
  const json* prompt = find(body, "prompt");
  if (!prompt) bad("prompt", "give either prompt (a string) or messages");
  std::string text = as_string(*prompt, "prompt");
  bool add_special = true;
  if (auto* v = find(body, "add_special_tokens")) add_special = as_bool(*v, "add_special_tokens");
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(model.generation.bos_token_id);
  auto encoded = model.tokenizer->encode(text);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  return ids;
}

std::vector<int32_t> parse_detokenize_request(const json& body, const ServedModel& model) {
  const json* tokens = find(body, "tokens");
  if (!tokens) bad("tokens", "tokens is required");
  return token_list(*tokens, "tokens", model);
}

}  // namespace qs
