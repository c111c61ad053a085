#pragma once
// Anthropic's Messages API, the request side (POST /v1/messages, POST /v1/messages/count_tokens). A Messages body is
// converted into the Chat Completions body that asks for the same thing, and that body goes through the chat parser
// (openai_protocol.h), as llama-server and vLLM do: both APIs share one Gemma 4 template, one tool-call and thinking
// parser, one constrained decoder and one generation path, and a fix to any of them reaches both.
//
//   system: string | [text blocks]              -> a system message
//   messages[i].content: string | [blocks]       user: text, image (base64 / url source), tool_result (each becomes
//                                                a tool message, placed before the rest of the user turn);
//                                                assistant: text, thinking (-> reasoning_content; redacted_thinking
//                                                is dropped), tool_use (-> tool_calls)
//   tools [{name, description, input_schema}]    -> function tools
//   tool_choice auto | any | tool | none         -> auto | required | the named function | none;
//               disable_parallel_tool_use        -> parallel_tool_calls false
//   thinking {type: enabled, budget_tokens}      -> chat_template_kwargs.enable_thinking (Gemma 4 has no budget:
//            | adaptive | between_tools            budget_tokens is checked, not enforced; adaptive and
//            | {type: disabled}                     between_tools are thinking on)
//   max_tokens (required), stop_sequences, temperature, top_p, top_k, stream, model; metadata is checked and unused
//
// A tool_result marked is_error reaches the model as "Error: " followed by its text (the Gemma 4 template has no
// error flag for tool responses). Unknown top-level fields are ignored; an unknown block type, a tool_result whose
// tool_use_id names no tool_use block of the previous assistant message, or a field of the wrong type is an ApiError
// 400 whose message starts with Anthropic's path of the field ("messages.1.content.0.type: ...").
#include <cstdint>
#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"

namespace qs {

enum class MessagesEndpoint { Create, CountTokens };

// The equivalent Chat Completions body. CountTokens: max_tokens and stream are not asked for.
nlohmann::json messages_to_chat_body(const nlohmann::json& body, MessagesEndpoint endpoint);

// POST /v1/messages: the internal chat request of the converted body (one choice).
CompletionRequest parse_messages_request(const nlohmann::json& body, const ServedModel& model);

// POST /v1/messages/count_tokens: the prompt tokens of the converted body as the chat path templates it (text only,
// as /tokenize: an image's tokens depend on its decoding).
int64_t count_message_tokens(const nlohmann::json& body, const ServedModel& model);

// {"type": "error", "error": {"type": <Anthropic's type for the status>, "message": ...}}
nlohmann::ordered_json anthropic_error_body(const ApiError& error);

}  // namespace qs
