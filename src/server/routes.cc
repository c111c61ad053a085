#include "server/routes.h"

#include <array>

namespace qs {
namespace {

struct RouteEntry {
  std::string_view method, path;
  Route route;
};

constexpr std::array kRoutes = {
    RouteEntry{"GET", "/", Route::ChatPage},
    RouteEntry{"GET", "/health", Route::Health},
    RouteEntry{"GET", "/v1/models", Route::Models},
    RouteEntry{"GET", "/props", Route::Props},
    RouteEntry{"GET", "/metrics", Route::Metrics},
    RouteEntry{"GET", "/debug/kv_blocks", Route::KvBlocks},
    RouteEntry{"POST", "/tokenize", Route::Tokenize},
    RouteEntry{"POST", "/detokenize", Route::Detokenize},
    RouteEntry{"GET", "/tokenizer_info", Route::TokenizerInfo},
    RouteEntry{"POST", "/v1/chat/completions", Route::ChatCompletions},
    RouteEntry{"POST", "/v1/completions", Route::Completions},
    RouteEntry{"POST", "/v1/responses", Route::Responses},
    RouteEntry{"POST", "/v1/messages", Route::Messages},
    RouteEntry{"POST", "/v1/messages/count_tokens", Route::CountMessageTokens},
    RouteEntry{"POST", "/v1/load_lora_adapter", Route::LoadLoraAdapter},
    RouteEntry{"POST", "/v1/unload_lora_adapter", Route::UnloadLoraAdapter},
    RouteEntry{"POST", "/v1/audio/transcriptions", Route::AudioTranscriptions},
};

constexpr std::string_view kResponsesPrefix = "/v1/responses/";
constexpr std::string_view kCancelSuffix = "/cancel";

// /v1/responses/{id} and /v1/responses/{id}/cancel: an id is one non-empty path segment.
Route stored_response_route(std::string_view method, std::string_view path) {
  const std::string_view rest = path.substr(kResponsesPrefix.size());
  const bool cancel = rest.ends_with(kCancelSuffix);
  const std::string_view id = cancel ? rest.substr(0, rest.size() - kCancelSuffix.size()) : rest;
  if (id.empty() || id.find('/') != std::string_view::npos) return Route::NotFound;
  if (cancel) return method == "POST" ? Route::ResponseCancel : Route::MethodNotAllowed;
  return method == "GET" || method == "DELETE" ? Route::ResponseById : Route::MethodNotAllowed;
}

}  // namespace

Route route_of(std::string_view method, std::string_view path, bool ui) {
  if (path.starts_with(kResponsesPrefix)) return stored_response_route(method, path);
  bool path_known = false;
  for (const RouteEntry& e : kRoutes) {
    if (e.path != path || (e.route == Route::ChatPage && !ui)) continue;
    if (e.method == method) return e.route;
    path_known = true;
  }
  return path_known ? Route::MethodNotAllowed : Route::NotFound;
}

std::vector<std::string> served_routes() {
  std::vector<std::string> out;
  for (const RouteEntry& e : kRoutes) out.push_back(std::string(e.method) + " " + std::string(e.path));
  for (const char* r : {"GET /v1/responses/{id}", "DELETE /v1/responses/{id}", "POST /v1/responses/{id}/cancel"})
    out.emplace_back(r);
  return out;
}

std::string_view response_id_of(std::string_view path) {
  if (!path.starts_with(kResponsesPrefix)) return {};
  std::string_view id = path.substr(kResponsesPrefix.size());
  if (id.ends_with(kCancelSuffix)) id.remove_suffix(kCancelSuffix.size());
  return id.find('/') == std::string_view::npos ? id : std::string_view();
}

}  // namespace qs
