#pragma once
// What the request parsers of Chat Completions, Completions and /tokenize share: the model-name check, the engine
// requests built once the prompt is known (sampling, stop, speculative decoding, max_tokens against the context, n
// choices), response_format as an output constraint, and a chat body's prompt.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "constrain/constraint_spec.h"
#include "media/media_input.h"
#include "server/openai_protocol.h"

namespace qs {

// What a request's `model` picks: the base (no adapter) or one of the served LoRA adapters (ServedModel::find_adapter).
struct ModelChoice {
  std::string name;                         // the adapter's; empty: the base
  std::shared_ptr<const LoraAdapter> lora;  // null: the base
};

// The model a request names. With --served-model-name or any LoRA adapter served, a request must name the base or
// an adapter; vLLM answers others with this 404 (and, as vLLM, a request that names no model gets the base).
// Checked before the prompt is read, as vLLM does.
ModelChoice resolve_model(const nlohmann::json& body, const ServedModel& model);

// Every choice of `request` runs on `choice`'s adapter, and the answer carries its name.
void apply_model_choice(CompletionRequest& request, const ModelChoice& choice);

// Everything chat and completions share, once the prompt is known.
CompletionRequest build_request(ApiKind kind, const nlohmann::json& body, const ServedModel& model,
                                std::vector<int32_t> prompt, LogprobOptions logprobs, int64_t min_max_tokens = 1);

// vLLM's return_tokens_as_token_ids.
bool tokens_as_ids(const nlohmann::json& body);

// response_format: text | json_object | json_schema {name, schema, strict}.
ConstraintSpec response_format_constraint(const nlohmann::json& body);

// A chat body's prompt (messages, tools, tool_choice, thinking) and what its output is read back with.
struct ChatPrompt {
  std::vector<int32_t> tokens;  // with one marker token per media item, not yet expanded to its soft tokens
  OutputParsing parsing;
  ConstraintSpec constraint;
  std::vector<media::MediaInput> media;
};

ChatPrompt chat_prompt_from_body(const nlohmann::json& body, const ServedModel& model);

// A chat request once its prompt is known: its media prepared (a failure is a 400 naming `media_param`), logprobs
// and the choices (build_request) read from `body`. Chat Completions and the audio transcriptions run through it.
CompletionRequest chat_request_from_prompt(const nlohmann::json& body, const ServedModel& model, ChatPrompt prompt,
                                           const std::string& media_param);

}  // namespace qs
