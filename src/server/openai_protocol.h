#pragma once
// The OpenAI-compatible wire format, without sockets: request bodies parsed and checked into engine requests, and
// engine results turned into response bodies and server-sent-event chunks. Everything here is a pure function of
// its inputs (plus the tokenizer), so the unit tests exercise it without a server or a model.
//
// Requests: unknown fields are ignored; a field of the wrong type or out of range is an ApiError (HTTP 400) whose
// OpenAI-shaped body names the parameter. Sampling fields left out take the checkpoint's generation_config.json
// defaults, as vLLM does.
#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/generation_config.h"
#include "media/media_fetch.h"
#include "media/media_input.h"
#include "server/logprobs_json.h"
#include "text/chat_template.h"
#include "text/tool_calls.h"
#include "util/error.h"

namespace qs {

class LoraAdapter;
class Tokenizer;

// A request the server refuses: the HTTP status and the fields of OpenAI's error object.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_, type_, code_;
};

// {"error":{"message":...,"type":...,"param":<name or null>,"code":<code or null>}}
nlohmann::ordered_json error_body(std::string_view message, std::string_view type = "invalid_request_error",
                                  std::string_view param = "", std::string_view code = "");
nlohmann::ordered_json error_body(const ApiError& error);

// A request body: a JSON object, else ApiError 400.
nlohmann::json parse_json_body(std::string_view body);

// JSON text as sent: invalid UTF-8 (never expected) is replaced rather than thrown on.
std::string dump_json(const nlohmann::ordered_json& value);

// Which media the served model reads, and how much of it a request may carry.
struct MediaOptions {
  bool images = false;                 // the checkpoint has a vision tower
  bool audio = false;                  // the checkpoint has an audio tower
  int max_items = 16;                  // images and clips per request
  int64_t max_bytes = 20 << 20;        // encoded bytes per item
  media::MediaFetchOptions fetch;      // http(s) image URLs: off unless the operator allows hosts
  // Soft tokens per image (server/image_budget.h): when the request names none (0: the processor's), and the most a
  // request may ask (detail "high" gets it).
  int image_soft_tokens = 0;
  int max_image_soft_tokens = 1120;
};

// What the protocol needs to know of the served model.
struct ServedModel {
  std::string name;                     // the id /v1/models lists and responses carry
  bool strict_name = false;  // requests naming another model get vLLM's 404 (else any name is served)
  const Tokenizer* tokenizer = nullptr;  // required
  GenerationConfig generation;
  Gemma4ChatDialect dialect;
  int64_t max_context = 0;  // positions per sequence (prompt + completion)
  int64_t vocab_size = 0;
  // tool_choice auto: a call the model opens is constrained to the declared tools (ConstraintSpec::Start::AtToolCall;
  // serve --no-tool-call-grammar: free, as vLLM).
  bool tool_call_grammar = true;
  MediaOptions media;
  // Decodes and preprocesses a chat prompt's media and expands its markers (engine/media_prompt.h:
  // prepare_media_prompt with the served towers); errors name the part. Unset (tests): media stay raw inputs.
  std::function<MediaPrompt(std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs)> prepare_media;
  // The LoRA adapter a request's `model` names (server/lora_registry.h), or null; unset: none are served.
  std::function<std::shared_ptr<const LoraAdapter>(const std::string& name)> find_adapter;
};

enum class ApiKind { Chat, Completion };

// How a chat choice's generated text (special tokens kept) is read back (text/tool_calls.h).
struct OutputParsing {
  bool enabled = false;            // tools or thinking: the text goes through ModelOutputSplitter
  bool tool_calls = false;         // tools given and tool_choice is not none: calls become message.tool_calls
  bool reasoning = false;          // thinking on: the thought channel becomes reasoning_content
  bool starts_in_thought = false;  // the prompt opened the thought channel, so the output starts inside it
};

struct CompletionRequest {
  ApiKind kind = ApiKind::Chat;
  std::string model;  // the id the answer carries: the LoRA adapter's name it asked for; empty: the served model's
  OutputParsing parsing;
  std::vector<EngineRequest> choices;  // one engine request per choice (n); with a seed, choice i uses seed + i
  int64_t prompt_tokens = 0;
  bool stream = false, include_usage = false;
  LogprobOptions logprobs;
  // The images and clips of a chat request, in the order their markers appear in the prompt, when the served model
  // has no prepare_media; with it they are prepared into each choice's EngineRequest::media and this stays empty.
  std::vector<media::MediaInput> media;
  // Completions' echo: each choice's prompt text (completion_prompts.h), written before its completion; with
  // logprobs its choices carry prompt logprobs (EngineRequest::prompt_logprobs).
  bool echo = false;
  std::vector<std::string> echo_texts;
  // stream_options.continuous_usage_stats (vLLM's, with include_usage): every chunk carries the usage so far.
  bool continuous_usage = false;
};

// The `model` an answer to `request` carries.
inline const std::string& answered_model(const CompletionRequest& request, const ServedModel& model) {
  return request.model.empty() ? model.name : request.model;
}

// POST /v1/chat/completions and POST /v1/completions bodies. Throw ApiError naming the parameter.
CompletionRequest parse_chat_request(const nlohmann::json& body, const ServedModel& model);
CompletionRequest parse_completion_request(const nlohmann::json& body, const ServedModel& model);

// Chat messages ([{role, content: string | [parts] | null, tool_calls?, tool_call_id?, name?, reasoning_content?}])
// as ChatMessages; param "messages". Parts: {type: "text", text}, {type: "image_url", image_url: {url: data URL, or
// an http(s) URL fetched when options.fetch allows its host (media/media_fetch.h)}},
// {type: "input_audio", input_audio: {data: base64, format}}; media parts (user and assistant messages only, and
// only the kinds `options` allows: else a 400 naming the part) are decoded from base64 into `media`, in order.
// Tool-call arguments (JSON strings) are parsed, as vLLM hands them to the template; a tool message needs its
// tool_call_id.
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& messages, const MediaOptions& options,
                                             std::vector<media::MediaInput>& media);
// OpenAI `tools` ([{type: "function", function: {name, description?, parameters?}}]); param "tools". parameters
// must be an object schema.
std::vector<ChatTool> parse_tools(const nlohmann::json& tools);
// The rendered prompt text of a conversation (the checkpoint's dialect).
std::string chat_prompt_text(std::span<const ChatMessage> messages, const ServedModel& model,
                             bool add_generation_prompt, bool enable_thinking, std::span<const ChatTool> tools);
// The prompt token ids of a conversation (the checkpoint's dialect; the template writes <bos>).
std::vector<int32_t> chat_prompt_tokens(std::span<const ChatMessage> messages, const ServedModel& model,
                                        bool add_generation_prompt, bool enable_thinking);

// POST /tokenize ({"prompt": str, "add_special_tokens"?} or {"messages": [...], "add_generation_prompt"?}) and
// POST /detokenize ({"tokens": [ids]}) bodies.
std::vector<int32_t> parse_tokenize_request(const nlohmann::json& body, const ServedModel& model);
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body, const ServedModel& model);

// One finished choice.
struct ChoiceResult {
  std::string text;  // as generated; with the template's markers when the request's parsing is enabled
  std::vector<SampledToken> tokens;
  std::vector<SampledToken> prompt_logprobs;  // prompt tokens 1..n-1 scored, when the request echoes with logprobs
  std::string finish_reason;  // stop | length | abort | error
  std::string error;
  int64_t completion_tokens = 0;
};

nlohmann::ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// A chat choice's message: {role, content} as generated, or, with parsing enabled, content without the template's
// markers (null when only calls were made), reasoning_content when thinking was on, tool_calls ({id: "call_...",
// type: "function", function: {name, arguments: JSON string}}), and finish_reason turned into "tool_calls".
nlohmann::ordered_json chat_message(const std::string& text, const OutputParsing& parsing, std::string& finish_reason);

// The whole non-streaming response: chat.completion or text_completion.
nlohmann::ordered_json completion_response(const CompletionRequest& request, const ServedModel& model,
                                           std::string_view id, int64_t created,
                                           std::span<const ChoiceResult> choices);

// "data: <json>\n\n"
std::string sse_frame(const nlohmann::ordered_json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// The server-sent events of one streaming request, in order: start(); event() for each engine event of any
// choice; finish() at the end. Chat starts each choice with a role chunk; content chunks carry the event's text
// (whole UTF-8: the engine never splits a character) and, when asked, its tokens' logprobs; a choice's last event
// adds a chunk with its finish_reason (an "error" finish sends an error object instead); with echo, a choice's first
// chunk starts with its prompt text (and logprobs) as vLLM streams it; finish() sends the
// usage chunk when stream_options.include_usage was set, then [DONE].
class SseStream {
 public:
  SseStream(const CompletionRequest& request, const ServedModel& model, std::string id, int64_t created);
  std::string start();
  std::string event(size_t choice, const EngineEvent& event);
  std::string finish();
  int64_t completion_tokens() const;  // so far, over all choices

 private:
  nlohmann::ordered_json chunk(size_t choice, nlohmann::ordered_json delta_or_text, const nlohmann::ordered_json& logprobs,
                               const std::string& finish_reason) const;
  nlohmann::ordered_json chat_delta(size_t choice, const OutputDelta& delta);

  ApiKind kind_;
  LogprobOptions logprobs_;
  bool include_usage_, continuous_usage_;
  const ServedModel& model_;
  std::string model_name_;  // answered_model
  std::string id_;
  int64_t created_;
  int64_t prompt_tokens_;
  std::vector<int64_t> completion_tokens_, text_offset_;
  OutputParsing parsing_;
  std::vector<ModelOutputSplitter> splitters_;  // per choice, when parsing is enabled
  std::vector<int> calls_sent_;                 // per choice: tool calls streamed so far (their delta index)
  // Completions' echo: per choice, its prompt until its first chunk has carried it.
  struct EchoedPrompt {
    std::string text;
    std::vector<int32_t> prompt;
  };
  std::vector<std::optional<EchoedPrompt>> unechoed_;
};

// "chatcmpl-<24 hex>" / "cmpl-<24 hex>"
std::string new_request_id(ApiKind kind);

}  // namespace qs
