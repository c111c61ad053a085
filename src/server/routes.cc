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
    RouteEntry{"POST", "/tokenize", Route::Tokenize},
    RouteEntry{"POST", "/detokenize", Route::Detokenize},
    RouteEntry{"POST", "/v1/chat/completions", Route::ChatCompletions},
    RouteEntry{"POST", "/v1/completions", Route::Completions},
    RouteEntry{"POST", "/v1/messages", Route::Messages},
    RouteEntry{"POST", "/v1/messages/count_tokens", Route::CountMessageTokens},
};

}  // namespace

Route route_of(std::string_view method, std::string_view path, bool ui) {
  bool path_known = false;
  for (const RouteEntry& e : kRoutes) {
    if (e.path != path || (e.route == Route::ChatPage && !ui)) continue;
    if (e.method == method) return e.route;
    path_known = true;
  }
  return path_known ? Route::MethodNotAllowed : Route::NotFound;
}

}  // namespace qs
