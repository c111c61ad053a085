#include "server/http_server.h"

#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/anthropic_messages_request.h"
#include "server/anthropic_messages_response.h"
#include "server/audio_transcriptions.h"
#include "server/exchange.h"
#include "server/generation_source.h"
#include "server/http_transport.h"
#include "server/in_flight_requests.h"
#include "server/info_routes.h"
#include "server/json_response.h"
#include "server/lora_admin.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/prepare_queue.h"
#include "server/request_id.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/routes.h"
#include "server/schema_key_order.h"
#include "server/server_log.h"
#include "server/serving_stack.h"
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

// Answers serve's routes over the stack it loads: authentication, dispatch, generation requests handed to the
// prepare workers and the engine, and the lifecycle (listen, load, warm up, drain).
class HttpServer {
 public:
  explicit HttpServer(const ServeOptions& options)
      : o_(options),
        server_(describe_server(options)),
        log_(parse_log_format(options.log_format)),
        metrics_(server_.model_name),
        stack_(o_, server_.model_name, log_),
        stored_responses_(options.responses_max_entries, options.responses_max_bytes) {}
  int run();

 private:
  void load();
  void drain();

  HttpReply handle(HttpRequest& req);
  HttpReply route(HttpRequest& req);
  bool authorized(const HttpRequest& req) const;

  HttpResponse lora_admin(const HttpRequest& req, Route route);
  HttpResponse tokenize(const HttpRequest& req);
  HttpResponse detokenize(const HttpRequest& req);
  HttpResponse stored_response(const HttpRequest& req, Route route);
  HttpResponse count_message_tokens(const HttpRequest& req);
  HttpReply generate(HttpRequest& req, Endpoint endpoint);
  void prepare(const std::shared_ptr<Exchange>& ex, Endpoint endpoint, const std::string& body);
  CompletionRequest parse_request(const std::shared_ptr<Exchange>& ex, Endpoint endpoint, const std::string& body);
  void submit_choices(const std::shared_ptr<Exchange>& ex, const CompletionRequest& request, Endpoint endpoint);

  ServeOptions o_;
  ServerDescription server_;
  ServerLog log_;
  ServerMetrics metrics_;
  InFlightRequests in_flight_{metrics_, log_};  // generation requests; outlives the connections that answer them
  std::unique_ptr<HttpTransport> transport_;  // reset before the engine: its connections' sources use the engine

  std::atomic<bool> ready_{false};
  ServingStack stack_;              // the model, the engine and what serves them
  ResponseStore stored_responses_;  // POST /v1/responses with store: true
  // Declared last, so destroyed (its workers joined) before the store and the engine its jobs use; drain() resets it
  // first anyway.
  std::unique_ptr<PrepareQueue> preparer_;
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
    case Route::ChatPage: return {chat_page_response(), nullptr};
    case Route::Health: return {health_response(server_, stack_, ready_.load()), nullptr};
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
  if (r == Route::Models) return {models_response(server_, stack_, ready_.load()), nullptr};
  if (r == Route::Props) return {props_response(server_, stack_, ready_.load()), nullptr};
  if (r == Route::Metrics) return {metrics_response(metrics_, stack_, ready_.load(), transport_->stats()), nullptr};
  if (!ready_.load()) throw ApiError(503, "the model is still loading; retry later", "", "server_error");
  switch (r) {
    case Route::Tokenize: return {tokenize(req), nullptr};
    case Route::Detokenize: return {detokenize(req), nullptr};
    case Route::TokenizerInfo: return {json_response(200, stack_.tokenizer_info()), nullptr};
    case Route::ChatCompletions: return generate(req, Endpoint::Chat);
    case Route::Responses: return generate(req, Endpoint::Responses);
    case Route::ResponseById:
    case Route::ResponseCancel: return {stored_response(req, r), nullptr};
    case Route::Messages: return generate(req, Endpoint::Messages);
    case Route::CountMessageTokens: return {count_message_tokens(req), nullptr};
    case Route::LoadLoraAdapter:
    case Route::UnloadLoraAdapter: return {lora_admin(req, r), nullptr};
    case Route::AudioTranscriptions: return generate(req, Endpoint::Transcription);
    case Route::KvBlocks: return {kv_blocks_response(stack_.engine(), stack_.kv_events()), nullptr};
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
      route == Route::LoadLoraAdapter ? load_lora_adapter(stack_.loras(), stack_.model(), req.body)
                                       : unload_lora_adapter(stack_.loras(), req.body);
  log_.write("lora", fmt::format("{} {}: {}", req.method, req.path, res.body), {{"path", req.path}});
  return res;
}

HttpResponse HttpServer::tokenize(const HttpRequest& req) {
  std::vector<int32_t> ids = parse_tokenize_request(parse_json_body(req.body), stack_.served());
  ojson body;
  body["tokens"] = ids;
  body["count"] = ids.size();
  body["max_model_len"] = stack_.served().max_context;
  return json_response(200, body);
}

// Anthropic's count_tokens: the Messages body converted and templated as /v1/messages would, nothing generated.
HttpResponse HttpServer::count_message_tokens(const HttpRequest& req) {
  ojson body;
  body["input_tokens"] = qs::count_message_tokens(parse_json_body(req.body), stack_.served());
  return json_response(200, body);
}

HttpResponse HttpServer::detokenize(const HttpRequest& req) {
  std::vector<int32_t> ids = parse_detokenize_request(parse_json_body(req.body), stack_.served());
  ojson body;
  body["prompt"] = stack_.tokenizer().decode(ids, /*skip_special_tokens=*/false);
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
  return {HttpResponse{}, generation_source(in_flight_, stack_.served(), ex)};
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
  if (endpoint == Endpoint::Chat) return parse_chat_request(parse_json_body(body), stack_.served());
  if (endpoint == Endpoint::Completion) return parse_completion_request(parse_json_body(body), stack_.served());
  if (endpoint == Endpoint::Messages) return parse_messages_request(parse_json_body(body), stack_.served());
  if (endpoint == Endpoint::Transcription) {
    TranscriptionRequest request = parse_transcription_request(ex->content_type, body, stack_.served());
    std::lock_guard lock(ex->mutex);
    ex->transcription = request.format;
    return std::move(request.chat);
  }
  ResponsesRequest request = parse_responses_request(parse_json_body(body), stack_.served(), &stored_responses_);
  auto writer = std::make_unique<ResponsesWriter>(request, answered_model(request.chat, stack_.served()), ex->id, ex->created, &stored_responses_);
  std::lock_guard lock(ex->mutex);
  ex->responses = std::move(writer);
  return std::move(request.chat);
}

void HttpServer::submit_choices(const std::shared_ptr<Exchange>& ex, const CompletionRequest& request,
                                Endpoint endpoint) {
  for (size_t i = 0; i < request.choices.size(); ++i) {
    SubmitResult r = stack_.engine().submit(request.choices[i], in_flight_.sink_for(ex, i));
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
    for (uint64_t id : cancel) stack_.engine().cancel(id);
    const std::string prompt_param =
        endpoint == Endpoint::Completion ? "prompt" : endpoint == Endpoint::Transcription ? "file" : "messages";
    switch (r.status) {
      case SubmitStatus::QueueFull: {
        EngineStats s = stack_.engine().stats();
        throw ApiError(429, fmt::format("the server is at capacity ({} running, {} waiting); retry later", s.running,
                                        s.waiting),
                       "", "rate_limit_error", "rate_limit_exceeded");
      }
      case SubmitStatus::Invalid: {
        std::string param = r.error.rfind("max_tokens", 0) == 0 ? "max_tokens" : prompt_param;
        if (r.constraint_error) {  // a tool's parameters are compiled at /tools/NAME/parameters
          const bool in_tools = request.choices[i].constraint.kind == ConstraintSpec::Kind::ToolCalls ||
                                r.error.find(" at /tools/") != std::string::npos;
          param = in_tools ? "tools" : "response_format";
        }
        throw ApiError(400, r.error.empty() ? "the engine refused the request" : r.error, param);
      }
      default: throw ApiError(503, "the server is shutting down", "", "server_error");
    }
  }
}

// ---- lifecycle -----------------------------------------------------------------------------------------------

// The stack, then what reads it: the connections' cancellations and the prepare workers.
void HttpServer::load() {
  stack_.load();
  in_flight_.set_engine(&stack_.engine());
  // Enough room for every sequence the engine runs and queues; past it requests are refused at once (429).
  preparer_ = std::make_unique<PrepareQueue>(kPrepareThreads, static_cast<size_t>(o_.max_running + o_.max_waiting));
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
    if (!interrupted()) stack_.warm_up();
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
    log_.write("ready", fmt::format("ready: model {} on {}", server_.model_name, server_.device),
               {{"model", server_.model_name}, {"device", server_.device}});
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
  Engine* engine = stack_.engine_if_loaded();
  if (engine) engine->stop_accepting();
  const EngineStats left = engine ? engine->stats() : EngineStats{};
  const double grace = std::chrono::duration<double>(o_.drain_grace).count();
  log_.write("draining",
             fmt::format("shutting down: no new connections; finishing {} running and {} waiting sequences (up to {:g} "
                         "s)", left.running, left.waiting, grace),
             {{"running", left.running}, {"waiting", left.waiting}, {"drain_timeout_s", grace}});
  if (engine) engine->drain(o_.drain_grace);
  preparer_.reset();  // what is still queued is refused by the engine (shutting down)
  // The engine has finished or aborted everything; give the connections a moment to send the last events, then
  // answer anything still waiting as aborted.
  for (int i = 0; i < 40 && in_flight_.active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  in_flight_.abandon_all();
  transport_->wait_idle(std::chrono::seconds(5));
  transport_.reset();
  ready_ = false;
  stack_.stop_engine();
}

}  // namespace

int run_server(const ServeOptions& options) {
  HttpServer server(options);
  return server.run();
}

}  // namespace qs
