#pragma once
// OpenAI's Responses API (POST /v1/responses) on the Chat Completions path: a request body becomes the Chat
// Completions body it is equivalent to, which parse_chat_request (openai_protocol.h) turns into the engine request,
// so the same template, tool declarations, thinking switch, tool-call parsing and constrained decoding apply. The
// output side (items and events from the generator's deltas) is responses_output.h; stored responses are
// response_store.h.
//
//   input                 a string (one user message) or items: messages (role user | system | developer |
//                         assistant; content a string or input_text / output_text / input_image parts),
//                         function_call, function_call_output (its call_id must name a function_call of the
//                         conversation), reasoning (content reasoning_text, else summary text)
//   instructions          a system message before everything (not carried over by previous_response_id, as OpenAI)
//   tools                 [{type: "function", name, description?, parameters?, strict?}]
//   tool_choice           auto | none | required | {type: "function", name}
//   text.format           text | json_object | json_schema {name, schema, strict?}: constrained decoding
//   reasoning.effort      Gemma 4 thinking on for any effort but "none" (as reasoning_effort on chat: Gemma 4 has
//                         no levels); off when reasoning or its effort is absent
//   max_output_tokens, temperature, top_p, parallel_tool_calls, stream, model; qatserve's top_k, seed,
//                         repetition_penalty and logit_bias as on chat
//   metadata, user, store (default true), previous_response_id: echoed, stored, continued
//
// Consecutive assistant-side items (reasoning, an assistant message, function calls) become one assistant message
// (reasoning_content, content, tool_calls), as the equivalent chat conversation writes them. Errors are ApiErrors in
// OpenAI's shape naming the Responses field (input, tools, text.format, max_output_tokens, ...).
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_protocol.h"
#include "server/response_store.h"

namespace qs {

struct ResponsesRequest {
  CompletionRequest chat;  // what the engine runs: one choice
  // The request fields a response object echoes (instructions, tools, tool_choice, text, reasoning, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  // The conversation so far as input items: the previous response's stored conversation, then this input.
  nlohmann::json conversation = nlohmann::json::array();
  bool store = true;
};

// The Chat Completions body equivalent to a Responses body whose input (with the previous response's conversation
// in front) is `conversation`. Throws ApiError naming the Responses field.
nlohmann::json responses_chat_body(const nlohmann::json& body, const nlohmann::json& conversation);

// POST /v1/responses: the body checked and converted. `store` resolves previous_response_id (404 naming it when
// unknown); null: no store, and previous_response_id is refused.
ResponsesRequest parse_responses_request(const nlohmann::json& body, const ServedModel& model, ResponseStore* store);

// An ApiError of the chat path renamed for a Responses client: messages -> input, response_format -> text.format,
// max_completion_tokens / max_tokens -> max_output_tokens, reasoning_effort -> reasoning.effort.
ApiError responses_error(const ApiError& chat_error);

// GET, DELETE and POST .../cancel on /v1/responses/{id}: the body to answer with; ApiError 404 in OpenAI's shape for
// an unknown id. Responses are answered when they finish, so none is ever in progress: cancel is refused (400) as
// OpenAI refuses it for a response not created with background (which this server does not take).
nlohmann::ordered_json retrieve_response(ResponseStore& store, const std::string& id);
nlohmann::ordered_json delete_response(ResponseStore& store, const std::string& id);
nlohmann::ordered_json cancel_response(ResponseStore& store, const std::string& id);

// "resp_<24 hex>"
std::string new_response_id();

}  // namespace qs
