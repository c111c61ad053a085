#pragma once
// serve's informational routes: what the server and its model are, answered on the I/O thread from what is loaded,
// never through the engine's queue (http_server.h lists the routes):
//   GET /          the chat page (chat_page.h) and the headers that confine it
//   GET /health    503 "loading" until the warm-up has run, then the backend, precision and modalities
//   GET /v1/models the model's card and each LoRA adapter's (lora_admin.h)
//   GET /props     llama.cpp server's fields that apply
//   GET /metrics   Prometheus text (metrics.h)
// Each is answered while the model loads too, so each reads the stack only once `ready` says it is loaded.
#include <cstdint>
#include <filesystem>
#include <string>

#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/serve_options.h"
#include "server/serving_stack.h"

namespace qs {

// What the server says of itself before the model is loaded.
struct ServerDescription {
  std::string model_name;  // --served-model-name, else the model directory's name
  std::string device;      // the CPU's model name, as /proc/cpuinfo gives it
  int64_t created = 0;     // /v1/models' "created": when the server started (unix seconds)
  std::filesystem::path model_dir;
  int max_running = 0;     // llama.cpp's total_slots
};
ServerDescription describe_server(const ServeOptions& options);

HttpResponse chat_page_response();
HttpResponse health_response(const ServerDescription& server, const ServingStack& stack, bool ready);
HttpResponse models_response(const ServerDescription& server, const ServingStack& stack, bool ready);
HttpResponse props_response(const ServerDescription& server, const ServingStack& stack, bool ready);
HttpResponse metrics_response(const ServerMetrics& metrics, const ServingStack& stack, bool ready,
                              const TransportStats& http);

}  // namespace qs
