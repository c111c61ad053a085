#pragma once
// Which of serve's routes a request names (http_server.h lists them), apart from the transport so that the fuzz
// target routes requests as the server does.
#include <string>
#include <string_view>
#include <vector>

namespace qs {

enum class Route {
  ChatPage, Health, Models, Props, Metrics, Tokenize, Detokenize, TokenizerInfo, ChatCompletions, Completions,
  Responses,         // POST /v1/responses
  ResponseById,      // GET or DELETE /v1/responses/{id}
  ResponseCancel,    // POST /v1/responses/{id}/cancel
  Messages, CountMessageTokens,  // Anthropic's Messages API (anthropic_messages_request.h)
  LoadLoraAdapter, UnloadLoraAdapter,  // vLLM's runtime LoRA API (lora_admin.h); 404 unless enabled
  AudioTranscriptions,  // POST /v1/audio/transcriptions (audio_transcriptions.h)
  KvBlocks,          // GET /debug/kv_blocks: the prefix blocks KV events report (server/kv_events_publisher.h)
  NotFound,          // no such path: 404
  MethodNotAllowed,  // the path exists, not with this method: 405
};

// `ui`: whether GET / serves the chat page (--no-ui: then / is not found).
Route route_of(std::string_view method, std::string_view path, bool ui);

// Every method and path route_of knows, as "GET /health" ({id}: one path segment), the chat page included: the list
// docs/api.md is checked against (tests/docs_test.cc).
std::vector<std::string> served_routes();

// The {id} of /v1/responses/{id} and /v1/responses/{id}/cancel; empty for any other path.
std::string_view response_id_of(std::string_view path);

}  // namespace qs
