#include "server/http_server.h"

#include <fmt/format.h>

#include <atomic>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/checkpoint_identity.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "engine/media_prompt.h"
#include "engine/memory_plan.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/lora_adapter.h"
#include "server/anthropic_messages_request.h"
#include "server/anthropic_messages_response.h"
#include "server/audio_transcriptions.h"
#include "server/chat_page.h"
#include "server/exchange.h"
#include "server/generation_source.h"
#include "server/http_transport.h"
#include "server/image_budget.h"
#include "server/in_flight_requests.h"
#include "server/json_response.h"
#include "server/lora_admin.h"
#include "server/lora_registry.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/prepare_queue.h"
#include "server/request_id.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/routes.h"
#include "server/schema_key_order.h"
#include "server/serve_plan.h"
#include "server/tokenizer_info.h"
#include "server/vllm_cache_config.h"
#include "server/server_log.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/interrupt.h"
#include "util/parallel.h"

namespace qs {
namespace {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

// Workers that prepare requests (prepare_queue.h): two, so one large image being decoded does not hold up the
// requests behind it.
constexpr unsigned kPrepareThreads = 2;

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

class HttpServer {
 public:
  explicit HttpServer(const ServeOptions& options)
      : o_(options),
        model_name_(options.served_model_name.empty() ? model_name_of(options.model_dir) : options.served_model_name),
        log_(parse_log_format(options.log_format)),
        metrics_(model_name_),
        stored_responses_(options.responses_max_entries, options.responses_max_bytes),
        loras_(model_name_, options.max_loras, options.max_lora_rank) {}
  int run();

 private:
  void load();
  void load_draft_model();
  void load_loras();
  HttpResponse lora_admin(const HttpRequest& req, Route route);
  void warm_up();
  void drain();

  HttpReply handle(HttpRequest& req);
  HttpReply route(HttpRequest& req);
  bool authorized(const HttpRequest& req) const;

  static HttpResponse chat_page();
  HttpResponse health();
  HttpResponse models();
  HttpResponse props();
  HttpResponse metrics();
  HttpResponse tokenize(const HttpRequest& req);
  HttpResponse detokenize(const HttpRequest& req);
  HttpResponse stored_response(const HttpRequest& req, Route route);
  HttpResponse count_message_tokens(const HttpRequest& req);
  HttpReply generate(HttpRequest& req, Endpoint endpoint);
  void prepare(const std::shared_ptr<Exchange>& ex, Endpoint endpoint, const std::string& body);
  CompletionRequest parse_request(const std::shared_ptr<Exchange>& ex, Endpoint endpoint, const std::string& body);
  void submit_choices(const std::shared_ptr<Exchange>& ex, const CompletionRequest& request, Endpoint endpoint);
  std::vector<std::string> modalities() const;

  void configure_engine(EngineOptions& eo);

  ServeOptions o_;
  std::string model_name_;
  std::string device_ = cpu_model_name();
  int64_t created_ = unix_seconds();  // the model's "created" in /v1/models
  ServerLog log_;
  ServerMetrics metrics_;
  InFlightRequests in_flight_{metrics_, log_};  // generation requests; outlives the connections that answer them
  std::unique_ptr<HttpTransport> transport_;  // reset before the engine: its connections' sources use the engine

  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> planned_resident_{0};  // the plan's cpu resident memory with this KV pool
  std::unique_ptr<Gemma4Model> model_;
  std::unique_ptr<Gemma4Model> draft_model_;    // --draft-model, for speculative decoding
  std::unique_ptr<Gemma4Assistant> assistant_;  // --assistant, for speculative decoding
  std::optional<Tokenizer> tokenizer_;
  std::optional<MediaTowers> towers_;  // the checkpoint's vision and audio towers (none, either or both)
  std::unique_ptr<KvEventsPublisher> kv_events_;  // --kv-events-endpoint; outlives the engine, which feeds it
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<PrepareQueue> preparer_;  // reset before the engine: its jobs submit to it
  ServedModel served_;
  ojson tokenizer_info_;  // GET /tokenizer_info, read at load
  ResponseStore stored_responses_;  // POST /v1/responses with store: true
  LoraRegistry loras_;              // the adapters a request's model may name
};

// ---- helpers -------------------------------------------------------------------------------------------------

// Constant time in the length of `expected`.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned diff = given.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

// The key as `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's), on any route.
bool HttpServer::authorized(const HttpRequest& req) const {
  if (o_.api_key.empty()) return true;
  const bool bearer = same_secret(req.authorization, "Bearer " + o_.api_key);
  const bool x_api_key = same_secret(req.api_key, o_.api_key);
  return bearer || x_api_key;
}

// ---- routes --------------------------------------------------------------------------------------------------

// Every request, on the I/O thread. Failures become OpenAI-shaped errors; those of requests the generation routes
// do not log themselves are logged here.
HttpReply HttpServer::handle(HttpRequest& req) {
  HttpReply reply;
  const bool anthropic = req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens";
  try {
    check_request_id(req.request_id);
    reply = route(req);
  } catch (const ApiError& e) {
    reply.response = error_response(e, anthropic);
  } catch (const std::exception& e) {
    reply.response = error_response(ApiError(500, e.what(), "", "server_error"), anthropic);
  }
  if (!reply.source && !req.request_id.empty() && valid_request_id(req.request_id))
    reply.response.headers.emplace_back("X-Request-Id", req.request_id);
  const int status = reply.response.status;
  if (!reply.source && status >= 400 && req.path != "/v1/chat/completions" && req.path != "/v1/completions" &&
      req.path != "/v1/responses" && req.path != "/v1/messages" && req.path != "/v1/audio/transcriptions" &&
      req.path != "/health")
    log_.write("http_error", fmt::format("{} {} -> {}", req.method, req.path, status),
               {{"method", req.method}, {"path", req.path}, {"status", status}}, "warning");
  return reply;
}

HttpReply HttpServer::route(HttpRequest& req) {
  const Route r = route_of(req.method, req.path, o_.ui);
  switch (r) {
    // The page holds no secret, so it is served without the key; it asks for one when the API answers 401.
    case Route::ChatPage: return {chat_page(), nullptr};
    case Route::Health: return {health(), nullptr};
    case Route::NotFound:
      throw ApiError(404, fmt::format("no route for {} {}", req.method, req.path), "", "invalid_request_error");
    case Route::MethodNotAllowed:
      throw ApiError(405, fmt::format("method {} is not allowed on {}", req.method, req.path), "",
                     "invalid_request_error");
    default: break;
  }
  if (!authorized(req))
    throw ApiError(401, "Incorrect API key provided: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                   "", "invalid_request_error", "invalid_api_key");
  if (r == Route::Models) return {models(), nullptr};
  if (r == Route::Props) return {props(), nullptr};
  if (r == Route::Metrics) return {metrics(), nullptr};
  if (!ready_.load()) throw ApiError(503, "the model is still loading; retry later", "", "server_error");
  switch (r) {
    case Route::Tokenize: return {tokenize(req), nullptr};
    case Route::Detokenize: return {detokenize(req), nullptr};
    case Route::TokenizerInfo: return {json_response(200, tokenizer_info_), nullptr};
    case Route::ChatCompletions: return generate(req, Endpoint::Chat);
    case Route::Responses: return generate(req, Endpoint::Responses);
    case Route::ResponseById:
    case Route::ResponseCancel: return {stored_response(req, r), nullptr};
    case Route::Messages: return generate(req, Endpoint::Messages);
    case Route::CountMessageTokens: return {count_message_tokens(req), nullptr};
    case Route::LoadLoraAdapter:
    case Route::UnloadLoraAdapter: return {lora_admin(req, r), nullptr};
    case Route::AudioTranscriptions: return generate(req, Endpoint::Transcription);
    case Route::KvBlocks: return {kv_blocks_response(*engine_, kv_events_.get()), nullptr};
    default: return generate(req, Endpoint::Completion);
  }
}

// GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel (openai_responses.h).
HttpResponse HttpServer::stored_response(const HttpRequest& req, Route route) {
  const std::string id(response_id_of(req.path));
  if (route == Route::ResponseCancel) return json_response(200, cancel_response(stored_responses_, id));
  if (req.method == "DELETE") return json_response(200, delete_response(stored_responses_, id));
  return json_response(200, retrieve_response(stored_responses_, id));
}

// vLLM's runtime LoRA routes, answered only with --enable-lora-runtime-loading (as vLLM's need
// VLLM_ALLOW_RUNTIME_LORA_UPDATING). Reading an adapter happens here, on the I/O thread.
HttpResponse HttpServer::lora_admin(const HttpRequest& req, Route route) {
  if (!o_.lora_runtime_loading)
    throw ApiError(404, fmt::format("no route for {} {} (start the server with --enable-lora-runtime-loading)",
                                    req.method, req.path), "", "invalid_request_error");
  const HttpResponse res =
      route == Route::LoadLoraAdapter ? load_lora_adapter(loras_, *model_, req.body) : unload_lora_adapter(loras_, req.body);
  log_.write("lora", fmt::format("{} {}: {}", req.method, req.path, res.body), {{"path", req.path}});
  return res;
}

HttpResponse HttpServer::health() {
  ojson body;
  if (!ready_.load()) {
    body["status"] = "loading";
    body["model"] = model_name_;
    return json_response(503, body);
  }
  body["status"] = "ok";
  body["backend"] = "cpu";
  body["device"] = device_;
  body["model"] = model_name_;
  ojson precision;
  precision["weights"] = model_->int4_weights() ? "w4_int4" : "bf16";
  precision["lm_head"] = model_->lm_head().kind == WeightKind::Int4 ? "w4_int4" : "bf16";
  precision["activations"] = precision_name(model_->precision());
  precision["kv_cache"] = engine_->kv_dtype();
  body["precision"] = std::move(precision);
  body["modalities"] = modalities();
  return json_response(200, body);
}

// What a request may carry: "text", and "image" / "audio" when the checkpoint has that tower.
std::vector<std::string> HttpServer::modalities() const {
  std::vector<std::string> m = {"text"};
  if (served_.media.images) m.push_back("image");
  if (served_.media.audio) m.push_back("audio");
  return m;
}

HttpResponse HttpServer::chat_page() {
  HttpResponse res;
  res.content_type = "text/html; charset=utf-8";
  // The browser enforces what the page promises: it may talk to this server only, and load nothing from elsewhere.
  res.headers = {{"Content-Security-Policy",
                  "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                  "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Cache-Control", "no-cache"}};
  res.body = std::string(chat_page_html());
  return res;
}

HttpResponse HttpServer::models() {
  ojson m;
  m["id"] = model_name_;
  m["object"] = "model";
  m["created"] = created_;
  m["owned_by"] = "qatserve";
  if (ready_.load()) {
    m["max_model_len"] = served_.max_context;
    // Not OpenAI's: which chat_template_kwargs this model's template takes (the chat page's thinking switch).
    m["chat_template_kwargs"] = served_.dialect.has_thinking_switch ? ojson::array({"enable_thinking"}) : ojson::array();
    m["modalities"] = modalities();  // not OpenAI's: the input kinds the checkpoint reads
  }
  m["root"] = o_.model_dir.string();  // vLLM's: the base's path, and each adapter's directory
  m["parent"] = nullptr;
  ojson body;
  body["object"] = "list";
  body["data"] = ojson::array({std::move(m)});
  for (ojson& card : lora_model_cards(loras_, model_name_, created_)) body["data"].push_back(std::move(card));
  return json_response(200, body);
}

// llama.cpp server's GET /props, the fields that apply: clients written for llama-server read the modalities there.
HttpResponse HttpServer::props() {
  ojson body;
  body["model_alias"] = model_name_;
  body["model_path"] = o_.model_dir.string();
  body["total_slots"] = o_.max_running;
  if (ready_.load()) {
    body["default_generation_settings"] = {{"n_ctx", served_.max_context}};
    body["modalities"] = {{"vision", served_.media.images}, {"audio", served_.media.audio}};
  }
  return json_response(200, body);
}

HttpResponse HttpServer::metrics() {
  GaugeValues g;
  g.ready = ready_.load();
  if (g.ready) {
    g.engine = engine_->stats();
    g.kv_dtype = engine_->kv_dtype();
    g.weight_bytes = model_->weight_bytes();
    g.vllm_cache_config = vllm_cache_config_labels({engine_->kv_block_size(), engine_->kv_blocks_total(),
        g.engine.kv_tokens_total, engine_->max_context(), g.kv_dtype, o_.kv_memory, kv_events_ != nullptr});
  }
  if (!o_.loras.empty() || o_.lora_runtime_loading) g.max_loras = loras_.max_loras();
  g.resident_bytes = resident_memory_bytes();
  g.planned_resident_bytes = planned_resident_.load();
  const TransportStats http = transport_->stats();
  g.http_connections = http.open;
  g.http_refused = http.refused;
  g.http_timeouts = http.timed_out;
  if (kv_events_) g.kv_events = GaugeValues::KvEventBatches{kv_events_->published(), kv_events_->dropped()};
  HttpResponse res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  res.body = metrics_.exposition(g);
  return res;
}

HttpResponse HttpServer::tokenize(const HttpRequest& req) {
  std::vector<int32_t> ids = parse_tokenize_request(parse_json_body(req.body), served_);
  ojson body;
  body["tokens"] = ids;
  body["count"] = ids.size();
  body["max_model_len"] = served_.max_context;
  return json_response(200, body);
}

// Anthropic's count_tokens: the Messages body converted and templated as /v1/messages would, nothing generated.
HttpResponse HttpServer::count_message_tokens(const HttpRequest& req) {
  ojson body;
  body["input_tokens"] = qs::count_message_tokens(parse_json_body(req.body), served_);
  return json_response(200, body);
}

HttpResponse HttpServer::detokenize(const HttpRequest& req) {
  std::vector<int32_t> ids = parse_detokenize_request(parse_json_body(req.body), served_);
  ojson body;
  body["prompt"] = tokenizer_->decode(ids, /*skip_special_tokens=*/false);
  return json_response(200, body);
}

// ---- generation ----------------------------------------------------------------------------------------------

// On the I/O thread: only a job posted for a worker (prepare), and the source the connection will read.
HttpReply HttpServer::generate(HttpRequest& req, Endpoint endpoint) {
  auto ex = std::make_shared<Exchange>();
  ex->anthropic = endpoint == Endpoint::Messages;
  if (endpoint == Endpoint::Responses) ex->id = new_response_id();
  else if (ex->anthropic) ex->id = new_message_id();
  else ex->id = new_request_id(endpoint == Endpoint::Chat ? ApiKind::Chat : ApiKind::Completion);
  ex->client_request_id = req.request_id;
  ex->path = req.path;
  ex->content_type = req.content_type;
  ex->arrival = Clock::now();
  ex->created = unix_seconds();
  if (!preparer_->post([this, ex, endpoint, body = std::move(req.body)] { prepare(ex, endpoint, body); })) {
    ApiError busy(429, "the server is at capacity (too many requests being prepared); retry later", "",
                  "rate_limit_error", "rate_limit_exceeded");
    in_flight_.refuse(*ex, busy);
    throw busy;
  }
  in_flight_.track(ex);
  return {HttpResponse{}, generation_source(in_flight_, served_, ex)};
}

// On a worker: the body parsed, templated and tokenized, its media decoded and preprocessed (the towers run later,
// on the engine thread), every choice submitted. Any failure is the request's refusal, sent before any response
// byte.
void HttpServer::prepare(const std::shared_ptr<Exchange>& ex, Endpoint endpoint, const std::string& body) {
  try {
    CompletionRequest request = parse_request(ex, endpoint, body);
    if (endpoint == Endpoint::Chat) keep_schema_key_order(request, body, SchemaField::ChatResponseFormat);
    if (endpoint == Endpoint::Responses) keep_schema_key_order(request, body, SchemaField::ResponsesTextFormat);
    {
      std::lock_guard lock(ex->mutex);
      if (ex->client_gone) return;  // nobody to answer
      ex->prompt_tokens = request.prompt_tokens;
      ex->sequences.resize(request.choices.size());
      ex->unfinished = request.choices.size();
    }
    submit_choices(ex, request, endpoint);
    for (EngineRequest& choice : request.choices) choice.media.clear();  // the engine holds them now
    std::lock_guard lock(ex->mutex);
    ex->prepared = std::move(request);
    if (ex->wake) ex->wake();
  } catch (const ApiError& e) {
    in_flight_.refuse(*ex, endpoint == Endpoint::Responses ? responses_error(e) : e);
  } catch (const std::exception& e) {
    in_flight_.refuse(*ex, ApiError(500, e.what(), "", "server_error"));
  }
}

// The engine request of a body; a Responses body also gets the writer of its answer (set on the exchange).
CompletionRequest HttpServer::parse_request(const std::shared_ptr<Exchange>& ex, Endpoint endpoint,
                                            const std::string& body) {
  if (endpoint == Endpoint::Chat) return parse_chat_request(parse_json_body(body), served_);
  if (endpoint == Endpoint::Completion) return parse_completion_request(parse_json_body(body), served_);
  if (endpoint == Endpoint::Messages) return parse_messages_request(parse_json_body(body), served_);
  if (endpoint == Endpoint::Transcription) {
    TranscriptionRequest request = parse_transcription_request(ex->content_type, body, served_);
    std::lock_guard lock(ex->mutex);
    ex->transcription = request.format;
    return std::move(request.chat);
  }
  ResponsesRequest request = parse_responses_request(parse_json_body(body), served_, &stored_responses_);
  auto writer = std::make_unique<ResponsesWriter>(request, answered_model(request.chat, served_), ex->id, ex->created, &stored_responses_);
  std::lock_guard lock(ex->mutex);
  ex->responses = std::move(writer);
  return std::move(request.chat);
}

void HttpServer::submit_choices(const std::shared_ptr<Exchange>& ex, const CompletionRequest& request,
                                Endpoint endpoint) {
  for (size_t i = 0; i < request.choices.size(); ++i) {
    SubmitResult r = engine_->submit(request.choices[i], in_flight_.sink_for(ex, i));
    if (r.status == SubmitStatus::Accepted) {
      std::lock_guard lock(ex->mutex);
      ex->sequences[i].engine_id = r.id;
      ex->sequences[i].submitted = true;
      continue;
    }
    // Refused: withdraw the choices already accepted and answer for the whole request.
    std::vector<uint64_t> cancel;
    {
      std::lock_guard lock(ex->mutex);
      ex->discarded = ex->client_gone = true;
      for (size_t k = 0; k < i; ++k) cancel.push_back(ex->sequences[k].engine_id);
    }
    for (uint64_t id : cancel) engine_->cancel(id);
    const std::string prompt_param =
        endpoint == Endpoint::Completion ? "prompt" : endpoint == Endpoint::Transcription ? "file" : "messages";
    switch (r.status) {
      case SubmitStatus::QueueFull: {
        EngineStats s = engine_->stats();
        throw ApiError(429, fmt::format("the server is at capacity ({} running, {} waiting); retry later", s.running,
                                        s.waiting),
                       "", "rate_limit_error", "rate_limit_exceeded");
      }
      case SubmitStatus::Invalid: {
        std::string param = r.error.rfind("max_tokens", 0) == 0 ? "max_tokens" : prompt_param;
        if (r.constraint_error)
          param = request.choices[i].constraint.kind == ConstraintSpec::Kind::ToolCalls ? "tools" : "response_format";
        throw ApiError(400, r.error.empty() ? "the engine refused the request" : r.error, param);
      }
      default: throw ApiError(503, "the server is shutting down", "", "server_error");
    }
  }
}

// ---- lifecycle -----------------------------------------------------------------------------------------------

void HttpServer::configure_engine(EngineOptions& eo) {
  eo.max_running = o_.max_running;
  eo.max_waiting = o_.max_waiting;
  eo.max_context = checked_max_model_len(o_.max_model_len, model_->config().text);
  eo.speculative = o_.speculative;
  eo.max_draft_tokens = o_.speculative.num_speculative_tokens;  // per-request opt-in up to the default's count
  eo.draft_model = draft_model_.get();
  eo.assistant = assistant_.get();
}

void HttpServer::load() {
  const auto t0 = Clock::now();
  // The progress line is for people; a JSON log stays one object per line (the "loaded" event has the time).
  model_ = Gemma4Model::load(o_.model_dir, parse_precision(o_.precision), log_.format() == LogFormat::Text);
  if (!o_.kv_dtype.empty()) model_->set_kv_dtype(parse_kv_dtype(o_.kv_dtype));
  const auto tokenizer_path = o_.model_dir / "tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path))
    throw Error(fmt::format("{}: no tokenizer.json, which serve needs", o_.model_dir.string()));
  tokenizer_ = Tokenizer::load(tokenizer_path);
  GenerationConfig generation = read_generation_config(o_.model_dir);
  load_draft_model();
  load_loras();
  EngineOptions eo;
  configure_engine(eo);
  const bool vision = model_->config().has_vision || model_->config().unified_vision.has_value();
  const ImageBudgets images = resolve_image_budgets(
      o_.image_soft_tokens, o_.max_image_soft_tokens,
      vision ? media::read_image_processor_options(o_.model_dir).max_soft_tokens : 0);
  const MemoryPlan plan = serve_plan(*model_, eo, images.max);
  eo.kv_bytes = o_.kv_memory ? o_.kv_memory : planned_kv_bytes(plan, *model_, eo);
  eo.media_cache_bytes = o_.media_cache_bytes;
  if (!o_.prefix_cache_dir.empty())
    eo.prefix_disk = DiskTierOptions{o_.prefix_cache_dir, o_.prefix_cache_disk_bytes,
                                     checkpoint_identity(model_->checkpoint()), /*adapter=*/0,
                                     [this](const std::string& line) { log_.write("prefix_cache", line, nullptr, "warning"); }};
  towers_ = MediaTowers::load(*model_, o_.model_dir);
  kv_events_ = connect_kv_events(eo, o_.kv_events, o_.kv_events_hash_seed);
  try {
    engine_ = std::make_unique<Engine>(*model_, &*tokenizer_, generation, eo, &*towers_);
    in_flight_.set_engine(engine_.get());
  } catch (const Error& e) {
    if (!o_.kv_memory) throw;
    throw Error(fmt::format("--kv-memory {}: {}", o_.kv_memory, e.what()));
  }
  if (o_.max_model_len > 0 && engine_->max_context() < o_.max_model_len)
    throw Error(fmt::format("--max-model-len {}: the KV pool ({} bytes, {}) holds only {} positions for one sequence; "
                            "give a larger --kv-memory or a smaller --max-model-len", o_.max_model_len,
                            engine_->stats().kv_bytes_total, o_.kv_memory ? "--kv-memory" : plan.device.note,
                            engine_->max_context()));
  tokenizer_info_ = tokenizer_info(o_.model_dir, engine_->max_context());
  served_.name = model_name_;
  // With adapters, a name that is neither the base nor an adapter is a mistake to report, not the base to serve.
  served_.strict_name = !o_.served_model_name.empty() || !o_.loras.empty() || o_.lora_runtime_loading;
  served_.find_adapter = [this](const std::string& name) { return loras_.find(name); };
  served_.tokenizer = &*tokenizer_;
  served_.generation = generation;
  served_.dialect = gemma4_chat_dialect_for_checkpoint(o_.model_dir, model_->config().text);
  served_.max_context = engine_->max_context();
  served_.vocab_size = model_->config().text.vocab_size;
  served_.media.fetch = o_.media_fetch;
  served_.media.images = towers_->images();
  served_.media.audio = towers_->audio();
  served_.media.image_soft_tokens = images.fallback;
  served_.media.max_image_soft_tokens = images.max;
  if (towers_->images() || towers_->audio())
    served_.prepare_media = [this](std::span<const int32_t> tokens, std::span<const media::MediaInput> inputs) {
      return prepare_media_prompt(tokens, inputs, *towers_, *tokenizer_);
    };
  // Enough room for every sequence the engine runs and queues; past it requests are refused at once (429).
  preparer_ = std::make_unique<PrepareQueue>(kPrepareThreads, static_cast<size_t>(o_.max_running + o_.max_waiting));
  const EngineStats s = engine_->stats();
  planned_resident_ = plan.cpu_resident_without_kv() + s.kv_bytes_total;
  const double load_s = seconds(Clock::now() - t0);
  log_.write("loaded",
             fmt::format("loaded {} ({} weights, {} activations, {} bytes of weights, context {}: {}, input {}) in "
                         "{:.2f} s", o_.model_dir.string(), model_->int4_weights() ? "int4" : "bf16",
                         precision_name(model_->precision()), model_->weight_bytes(), served_.max_context,
                         engine_->max_context_reason(), fmt::join(modalities(), "+"), load_s),
             {{"model_dir", o_.model_dir.string()}, {"weights", model_->int4_weights() ? "int4" : "bf16"},
              {"modalities", modalities()},
              {"activations", precision_name(model_->precision())}, {"weight_bytes", model_->weight_bytes()},
              {"max_model_len", served_.max_context}, {"max_model_len_reason", engine_->max_context_reason()},
              {"load_s", load_s},
              {"threads", ThreadPool::shared().size()}});
  const std::string kv_source =
      o_.kv_memory ? "--kv-memory" : fmt::format("from the memory plan of {} bytes: {}", plan.device.bytes, plan.device.note);
  log_.write("kv_pool",
             fmt::format("KV pool {} bytes ({}), {} blocks, {} KV, {} positions for the full-attention layers",
                         s.kv_bytes_total, kv_source, s.kv_blocks_total, engine_->kv_dtype(), s.kv_tokens_total),
             {{"kv_bytes", s.kv_bytes_total}, {"source", kv_source}, {"blocks", s.kv_blocks_total},
              {"kv_dtype", engine_->kv_dtype()}, {"positions", s.kv_tokens_total}});
}

// --draft-model and --assistant: loaded in the model's precision; the default speculative method checked (a draft
// model's vocabulary against the model's, an assistant's fit).
void HttpServer::load_draft_model() {
  const bool progress = log_.format() == LogFormat::Text;
  if (!o_.draft_model.empty()) draft_model_ = Gemma4Model::load(o_.draft_model, model_->precision(), progress);
  if (!o_.assistant.empty()) {
    assistant_ = Gemma4Assistant::load(o_.assistant, *model_, progress);
    log_.write("assistant", fmt::format("assistant drafter {} for speculative decoding", o_.assistant.string()),
               {{"assistant", o_.assistant.string()}});
  }
  make_drafter(o_.speculative, *model_, draft_model_.get(), 1, assistant_.get());  // the default works, or why not
  if (o_.draft_model.empty()) return;
  log_.write("draft_model", fmt::format("draft model {} for speculative decoding ({} bytes of weights)",
                                        o_.draft_model.string(), draft_model_->weight_bytes()),
             {{"draft_model", o_.draft_model.string()}, {"weight_bytes", draft_model_->weight_bytes()}});
}

// --lora NAME=DIR, each read and checked against the model (a bad one stops the server, naming it).
void HttpServer::load_loras() {
  if (static_cast<int>(o_.loras.size()) > o_.max_loras)
    throw Error(fmt::format("--lora names {} adapters but --max-loras is {}; give --max-loras {}", o_.loras.size(),
                            o_.max_loras, o_.loras.size()));
  for (const auto& [name, dir] : o_.loras) {
    try {
      loras_.load(name, dir, *model_);
    } catch (const ApiError& e) {
      throw Error(fmt::format("--lora {}={}: {}", name, dir.string(), e.what()));
    }
    const auto adapter = loras_.find(name);
    log_.write("lora", fmt::format("LoRA adapter {} from {}: {} linears, rank up to {}, {} bytes", name, dir.string(),
                                   adapter->weights().size(), adapter->max_rank(), adapter->bytes()),
               {{"lora_name", name}, {"lora_path", dir.string()}, {"bytes", adapter->bytes()}});
  }
}

// Readiness means the model has really run: one 1-token request through the engine.
void HttpServer::warm_up() {
  const auto t0 = Clock::now();
  EngineRequest r;
  r.prompt = {served_.generation.bos_token_id};
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  auto done = std::make_shared<std::promise<std::string>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  SubmitResult s = engine_->submit(r, [done, once](EngineEvent&& e) {
    if (e.finished && !once->exchange(true)) done->set_value(e.finish_reason == "error" ? e.error : "");
    return true;
  });
  if (s.status != SubmitStatus::Accepted) throw Error(fmt::format("warm-up request refused by the engine: {}", s.error));
  auto result = done->get_future();
  while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (interrupted()) {
      engine_->cancel(s.id);
      return;
    }
  }
  std::string error = result.get();
  if (!error.empty()) throw Error("warm-up request failed: " + error);
  const double warm_up_s = seconds(Clock::now() - t0);
  log_.write("warm_up", fmt::format("warm-up forward pass in {:.3f} s", warm_up_s), {{"warm_up_s", warm_up_s}});
}

int HttpServer::run() {
  TransportOptions t;
  t.host = o_.host;
  t.port = o_.port;
  t.max_body_bytes = o_.max_body_bytes;
  t.header_timeout = o_.header_timeout;
  t.body_timeout = o_.body_timeout;
  t.max_connections = o_.max_connections;
  transport_ = std::make_unique<HttpTransport>(t, [this](HttpRequest& req) { return handle(req); }, log_);
  ThreadPool::set_shared_threads(o_.threads);  // before the model's first parallel_for creates the pool
  transport_->start();
  log_.write("listening",
             fmt::format("listening on http://{}:{}/ (up to {} connections); loading {}", o_.host, o_.port,
                         transport_->max_connections(), o_.model_dir.string()),
             {{"host", o_.host}, {"port", o_.port}, {"max_connections", transport_->max_connections()},
              {"model_dir", o_.model_dir.string()}});

  try {
    load();
    if (!interrupted()) warm_up();
  } catch (...) {
    transport_.reset();
    if (interrupted()) {  // a signal cut the load short: that is a clean stop, not a failure
      log_.write("stopped", "interrupted while loading; stopped");
      return 0;
    }
    throw;
  }
  if (!interrupted()) {
    ready_ = true;
    log_.write("ready", fmt::format("ready: model {} on {}", model_name_, device_),
               {{"model", model_name_}, {"device", device_}});
  }
  while (!interrupted()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  drain();
  log_.write("stopped", "stopped");
  return 0;
}

// No new connection, then the engine finishes what it holds within the grace; the rest is aborted.
void HttpServer::drain() {
  // Nothing new gets in before the count below, so the log says exactly what the drain has to finish.
  transport_->stop_accepting();
  if (engine_) engine_->stop_accepting();
  const EngineStats left = engine_ ? engine_->stats() : EngineStats{};
  const double grace = std::chrono::duration<double>(o_.drain_grace).count();
  log_.write("draining",
             fmt::format("shutting down: no new connections; finishing {} running and {} waiting sequences (up to {:g} "
                         "s)", left.running, left.waiting, grace),
             {{"running", left.running}, {"waiting", left.waiting}, {"drain_timeout_s", grace}});
  if (engine_) engine_->drain(o_.drain_grace);
  preparer_.reset();  // what is still queued is refused by the engine (shutting down)
  // The engine has finished or aborted everything; give the connections a moment to send the last events, then
  // answer anything still waiting as aborted.
  for (int i = 0; i < 40 && in_flight_.active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  in_flight_.abandon_all();
  transport_->wait_idle(std::chrono::seconds(5));
  transport_.reset();
  ready_ = false;
  engine_.reset();
}

}  // namespace

int run_server(const ServeOptions& options) {
  HttpServer server(options);
  return server.run();
}

}  // namespace qs
