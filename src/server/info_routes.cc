#include "server/info_routes.h"

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "server/chat_page.h"
#include "server/json_response.h"
#include "server/lora_admin.h"
#include "server/vllm_cache_config.h"

namespace qs {
namespace {

using ojson = nlohmann::ordered_json;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      size_t start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "unknown cpu";
}

std::string model_name_of(const std::filesystem::path& dir) {
  std::filesystem::path p = dir;
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  return name.empty() || name == "." ? std::filesystem::absolute(p).filename().string() : name;
}

}  // namespace

ServerDescription describe_server(const ServeOptions& options) {
  ServerDescription d;
  d.model_name = options.served_model_name.empty() ? model_name_of(options.model_dir) : options.served_model_name;
  d.device = cpu_model_name();
  d.created = unix_seconds();
  d.model_dir = options.model_dir;
  d.max_running = options.max_running;
  return d;
}

HttpResponse chat_page_response() {
  HttpResponse res;
  res.content_type = "text/html; charset=utf-8";
  // The browser enforces what the page promises: it may talk to this server only, and load nothing from elsewhere.
  res.headers = {{"Content-Security-Policy",
                  "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                  "img-src data:; media-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Cache-Control", "no-cache"}};
  res.body = std::string(chat_page_html());
  return res;
}

HttpResponse health_response(const ServerDescription& server, const ServingStack& stack, bool ready) {
  ojson body;
  if (!ready) {
    body["status"] = "loading";
    body["model"] = server.model_name;
    return json_response(503, body);
  }
  body["status"] = "ok";
  body["backend"] = "cpu";
  body["device"] = server.device;
  body["model"] = server.model_name;
  const Gemma4Model& model = stack.model();
  ojson precision;
  precision["weights"] = model.int4_weights() ? "w4_int4" : "bf16";
  precision["lm_head"] = model.lm_head().kind == WeightKind::Int4 ? "w4_int4" : "bf16";
  precision["activations"] = precision_name(model.precision());
  precision["kv_cache"] = stack.engine().kv_dtype();
  body["precision"] = std::move(precision);
  body["modalities"] = stack.modalities();
  return json_response(200, body);
}

HttpResponse models_response(const ServerDescription& server, const ServingStack& stack, bool ready) {
  ojson m;
  m["id"] = server.model_name;
  m["object"] = "model";
  m["created"] = server.created;
  m["owned_by"] = "qatserve";
  if (ready) {
    const ServedModel& served = stack.served();
    m["max_model_len"] = served.max_context;
    // Not OpenAI's: which chat_template_kwargs this model's template takes (the chat page's thinking switch).
    m["chat_template_kwargs"] = served.dialect.has_thinking_switch ? ojson::array({"enable_thinking"}) : ojson::array();
    m["modalities"] = stack.modalities();  // not OpenAI's: the input kinds the checkpoint reads
  }
  m["root"] = server.model_dir.string();  // vLLM's: the base's path, and each adapter's directory
  m["parent"] = nullptr;
  ojson body;
  body["object"] = "list";
  body["data"] = ojson::array({std::move(m)});
  for (ojson& card : lora_model_cards(stack.loras(), server.model_name, server.created))
    body["data"].push_back(std::move(card));
  return json_response(200, body);
}

// llama.cpp server's GET /props, the fields that apply: clients written for llama-server read the modalities there.
HttpResponse props_response(const ServerDescription& server, const ServingStack& stack, bool ready) {
  ojson body;
  body["model_alias"] = server.model_name;
  body["model_path"] = server.model_dir.string();
  body["total_slots"] = server.max_running;
  if (ready) {
    const ServedModel& served = stack.served();
    body["default_generation_settings"] = {{"n_ctx", served.max_context}};
    body["modalities"] = {{"vision", served.media.images}, {"audio", served.media.audio}};
  }
  return json_response(200, body);
}

HttpResponse metrics_response(const ServerMetrics& metrics, const ServingStack& stack, bool ready,
                              const TransportStats& http) {
  GaugeValues g;
  g.ready = ready;
  if (g.ready) {
    g.engine = stack.engine().stats();
    g.kv_dtype = stack.engine().kv_dtype();
    g.weight_bytes = stack.model().weight_bytes();
    const Engine& engine = stack.engine();
    g.vllm_cache_config = vllm_cache_config_labels({engine.kv_block_size(), engine.kv_blocks_total(),
        g.engine.kv_tokens_total, engine.max_context(), g.kv_dtype, stack.options().kv_memory,
        stack.kv_events() != nullptr});
  }
  if (!stack.options().loras.empty() || stack.options().lora_runtime_loading) g.max_loras = stack.loras().max_loras();
  g.resident_bytes = resident_memory_bytes();
  g.planned_resident_bytes = stack.planned_resident_bytes();
  g.http_connections = http.open;
  g.http_refused = http.refused;
  g.http_timeouts = http.timed_out;
  if (const KvEventsPublisher* kv_events = stack.kv_events())
    g.kv_events = GaugeValues::KvEventBatches{kv_events->published(), kv_events->dropped()};
  HttpResponse res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  res.body = metrics.exposition(g);
  return res;
}

}  // namespace qs
