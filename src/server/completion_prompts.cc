#include "server/completion_prompts.h"

#include <fmt/format.h>

#include "text/tokenizer.h"

namespace qs {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

const json* find(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

CompletionPrompt text_prompt(const std::string& text, const ServedModel& model) {
  CompletionPrompt p;
  p.tokens.push_back(model.generation.bos_token_id);
  auto ids = model.tokenizer->encode(text);
  p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  p.text = text;
  return p;
}

CompletionPrompt token_prompt(const json& ids, const std::string& where, const ServedModel& model) {
  if (ids.empty()) bad("prompt", fmt::format("{} is empty", where));
  CompletionPrompt p;
  for (const json& x : ids) {
    const bool integer = x.is_number_integer() || x.is_number_unsigned();
    const int64_t id = integer ? x.get<int64_t>() : -1;
    if (!integer || id < 0 || id >= model.vocab_size)
      bad("prompt", fmt::format("{}: {} is not a token id in [0, {})", where, x.dump(), model.vocab_size));
    p.tokens.push_back(static_cast<int32_t>(id));
  }
  p.text = model.tokenizer->decode(p.tokens, /*skip_special_tokens=*/false);
  return p;
}

CompletionPrompt one_prompt(const json& v, const std::string& where, const ServedModel& model) {
  if (v.is_string()) return text_prompt(v.get<std::string>(), model);
  if (v.is_array()) return token_prompt(v, where, model);
  bad("prompt", fmt::format("{} must be a string or a list of token ids", where));
}

}  // namespace

std::vector<CompletionPrompt> parse_completion_prompts(const json& prompt, const ServedModel& model) {
  const bool batch = prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array());
  if (!batch) return {one_prompt(prompt, "prompt", model)};
  if (prompt.size() > kMaxBatchPrompts)
    bad("prompt", fmt::format("prompt: a batch holds at most {} prompts, got {}", kMaxBatchPrompts, prompt.size()));
  std::vector<CompletionPrompt> out;
  for (size_t i = 0; i < prompt.size(); ++i) out.push_back(one_prompt(prompt[i], fmt::format("prompt[{}]", i), model));
  return out;
}

bool parse_echo(const json& body) {
  const json* echo = find(body, "echo");
  if (!echo) return false;
  if (!echo->is_boolean()) bad("echo", fmt::format("echo must be a boolean, got {}", echo->dump()));
  if (!echo->get<bool>()) return false;
  if (const json* n = find(body, "n"); n && !(n->is_number() && n->get<double>() == 1))
    bad("n", "echo returns the prompt with one completion: n must be 1 with echo");
  if (find(body, "best_of")) bad("best_of", "best_of cannot be combined with echo");
  return true;
}

}  // namespace qs
