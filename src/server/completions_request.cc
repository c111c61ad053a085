// POST /v1/completions bodies (parse_completion_request in openai_protocol.h): one or a batch of prompts (text or
// token ids, completion_prompts.h), echo with prompt logprobs, and the fields this server refuses.
#include <optional>
#include <string>

#include "server/completion_prompts.h"
#include "server/openai_protocol.h"
#include "server/openai_request.h"
#include "server/request_fields.h"

namespace qs {

using json = nlohmann::json;
using namespace request_fields;

CompletionRequest parse_completion_request(const json& body, const ServedModel& model) {
  const ModelChoice chosen = resolve_model(body, model);
  const json* prompt = find(body, "prompt");
  if (!prompt) bad("prompt", "prompt is required");
  std::vector<CompletionPrompt> prompts = parse_completion_prompts(*prompt, model);
  const bool echo = parse_echo(body);
  if (response_format_constraint(body).active())
    bad("response_format", "response_format is supported on /v1/chat/completions only");
  if (auto* v = find(body, "suffix"); v && !as_string(*v, "suffix").empty())
    bad("suffix", "suffix is not supported by this server");
  if (auto* v = find(body, "best_of"); v && as_integer(*v, "best_of") > 1)
    bad("best_of", "best_of is not supported by this server (use n)");
  LogprobOptions lp;
  if (auto* v = find(body, "logprobs")) {
    lp.enabled = true;
    lp.top = static_cast<int32_t>(as_integer_in(*v, "logprobs", 0, kMaxTopLogprobs));
  }
  lp.tokens_as_ids = tokens_as_ids(body);
  // A batch's choices: each prompt's n in turn; with echo, each scores its prompt (max_tokens 0: only that).
  std::optional<CompletionRequest> all;
  for (CompletionPrompt& p : prompts) {
    CompletionRequest one = build_request(ApiKind::Completion, body, model, std::move(p.tokens), lp, echo ? 0 : 1);
    for (EngineRequest& e : one.choices) {
      if (echo && (lp.enabled || e.max_tokens == 0)) e.prompt_logprobs = lp.top;
      if (echo) one.echo_texts.push_back(p.text);
    }
    if (!all) {
      all = std::move(one);
      continue;
    }
    all->prompt_tokens += one.prompt_tokens;
    for (EngineRequest& e : one.choices) all->choices.push_back(std::move(e));
    for (std::string& t : one.echo_texts) all->echo_texts.push_back(std::move(t));
  }
  all->echo = echo;
  apply_model_choice(*all, chosen);
  return std::move(*all);
}

}  // namespace qs
