#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/generation_config.h"
#include "engine/memory_plan.h"
#include "model/gemma4.h"
#include "server/chat_page.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/server_log.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/file.h"
#include "util/interrupt.h"
#include "util/parallel.h"

namespace qs {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

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

// httplib's stop() marks the server socket invalid, which also ends every streaming response at its next chunk.
// Draining must close the listener yet let streams finish, so it shuts the listening socket down instead: accept()
// fails, the accept loop ends and joins the connection threads as they finish.
class Listener : public httplib::Server {
 public:
  void stop_accepting() {
    auto sock = svr_sock_.load();
    if (sock != INVALID_SOCKET) ::shutdown(sock, SHUT_RDWR);
  }
};

// One sequence (choice) of an HTTP request.
struct Sequence {
  uint64_t engine_id = 0;
  bool submitted = false, finished = false;
  std::optional<Clock::time_point> first_token, last_token;
  Clock::time_point end;
  int64_t generated = 0;
  std::string finish_reason;
};

// One generation request: the engine's sinks (engine thread) queue events here; the HTTP thread consumes them.
struct Exchange {
  std::string id, path;
  Clock::time_point arrival;
  int64_t created = 0;  // unix seconds, as responses report it
  int64_t prompt_tokens = 0;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::pair<size_t, EngineEvent>> events;
  std::vector<Sequence> sequences;
  size_t unfinished = 0;
  bool client_gone = false;  // sinks answer false: the engine cancels
  bool discarded = false;    // rejected at submit: nothing is recorded
  bool stream_started = false;
};

class HttpServer {
 public:
  explicit HttpServer(const ServeOptions& options)
      : o_(options),
        model_name_(options.served_model_name.empty() ? model_name_of(options.model_dir) : options.served_model_name),
        log_(parse_log_format(options.log_format)),
        metrics_(model_name_) {}
  int run();

 private:
  void add_routes();
  void load();
  void warm_up();

  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  httplib::Server::Handler guarded(bool needs_model, Handler handler);
  bool authorized(const httplib::Request& req) const;
  static void send_json(httplib::Response& res, int status, const ojson& body);
  static void send_error(httplib::Response& res, const ApiError& e);

  static void chat_page(const httplib::Request&, httplib::Response&);
  void health(const httplib::Request&, httplib::Response&);
  void models(const httplib::Request&, httplib::Response&);
  void metrics(const httplib::Request&, httplib::Response&);
  void tokenize(const httplib::Request&, httplib::Response&);
  void detokenize(const httplib::Request&, httplib::Response&);
  void generate(const httplib::Request&, httplib::Response&, ApiKind kind);

  EventSink sink_for(const std::shared_ptr<Exchange>& ex, size_t index);
  void finish_sequence(Exchange& ex, size_t index, const std::string& reason, Clock::time_point now);
  void client_gone(Exchange& ex);
  void abandon_unfinished(Exchange& ex);
  void log_request(Exchange& ex);
  void configure_engine(EngineOptions& eo);

  ServeOptions o_;
  std::string model_name_;
  std::string device_ = cpu_model_name();
  int64_t created_ = unix_seconds();  // the model's "created" in /v1/models
  ServerLog log_;
  Listener http_;
  ServerMetrics metrics_;

  std::atomic<bool> ready_{false};
  std::atomic<bool> abandon_{false};  // after the drain grace: waiters stop waiting for the engine
  std::atomic<int> active_{0};        // generation requests in flight
  std::atomic<uint64_t> planned_resident_{0};  // the plan's cpu resident memory with this KV pool
  std::unique_ptr<Gemma4Model> model_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  ServedModel served_;
};

// ---- helpers -------------------------------------------------------------------------------------------------

void HttpServer::send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void HttpServer::send_error(httplib::Response& res, const ApiError& e) {
  if (e.status() == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status(), error_body(e));
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (o_.api_key.empty()) return true;
  const std::string expected = "Bearer " + o_.api_key;
  const std::string given = req.get_header_value("Authorization");
  // Constant time in the key's length.
  unsigned diff = given.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

httplib::Server::Handler HttpServer::guarded(bool needs_model, Handler handler) {
  return [this, needs_model, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      if (!authorized(req))
        throw ApiError(401, "Incorrect API key provided: send it as 'Authorization: Bearer <key>'.", "",
                       "invalid_request_error", "invalid_api_key");
      if (needs_model && !ready_.load()) throw ApiError(503, "the model is still loading; retry later", "", "server_error");
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what(), "", "server_error"));
    }
  };
}

// ---- routes --------------------------------------------------------------------------------------------------

void HttpServer::add_routes() {
  // The page holds no secret, so it is served without the key; it asks for one when the API answers 401.
  if (o_.ui) http_.Get("/", chat_page);
  http_.Get("/health", [this](const httplib::Request& req, httplib::Response& res) { health(req, res); });
  http_.Get("/v1/models", guarded(false, [this](auto& req, auto& res) { models(req, res); }));
  http_.Get("/metrics", guarded(false, [this](auto& req, auto& res) { metrics(req, res); }));
  http_.Post("/tokenize", guarded(true, [this](auto& req, auto& res) { tokenize(req, res); }));
  http_.Post("/detokenize", guarded(true, [this](auto& req, auto& res) { detokenize(req, res); }));
  http_.Post("/v1/chat/completions", guarded(true, [this](auto& req, auto& res) { generate(req, res, ApiKind::Chat); }));
  http_.Post("/v1/completions",
             guarded(true, [this](auto& req, auto& res) { generate(req, res, ApiKind::Completion); }));

  // Errors httplib answers itself (no route, body too large, malformed request) get OpenAI-shaped bodies too.
  http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404: message = fmt::format("no route for {} {}", req.method, req.path); break;
      case 405: message = fmt::format("method {} is not allowed on {}", req.method, req.path); break;
      case 413: message = fmt::format("the request body is larger than the limit of {} bytes", o_.max_body_bytes); break;
      case 414: message = "the request URI is too long"; break;
      default: message = fmt::format("HTTP {}", res.status); break;
    }
    res.set_content(dump_json(error_body(message, res.status >= 500 ? "server_error" : "invalid_request_error")),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body(message, "server_error"));
  });
  // Requests the generation routes do not log themselves are logged when they fail.
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (res.status >= 400 && req.path != "/v1/chat/completions" && req.path != "/v1/completions" &&
        req.path != "/health")
      log_.write("http_error", fmt::format("{} {} -> {}", req.method, req.path, res.status),
                 {{"method", req.method}, {"path", req.path}, {"status", res.status}}, "warning");
  });
}

void HttpServer::health(const httplib::Request&, httplib::Response& res) {
  ojson body;
  if (!ready_.load()) {
    body["status"] = "loading";
    body["model"] = model_name_;
    send_json(res, 503, body);
    return;
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
  send_json(res, 200, body);
}

void HttpServer::chat_page(const httplib::Request&, httplib::Response& res) {
  // The browser enforces what the page promises: it may talk to this server only, and load nothing from elsewhere.
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                 "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Cache-Control", "no-cache");
  const std::string_view page = chat_page_html();
  res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
}

void HttpServer::models(const httplib::Request&, httplib::Response& res) {
  ojson m;
  m["id"] = model_name_;
  m["object"] = "model";
  m["created"] = created_;
  m["owned_by"] = "qatserve";
  if (ready_.load()) {
    m["max_model_len"] = served_.max_context;
    // Not OpenAI's: which chat_template_kwargs this model's template takes (the chat page's thinking switch).
    m["chat_template_kwargs"] = served_.dialect.has_thinking_switch ? ojson::array({"enable_thinking"}) : ojson::array();
  }
  ojson body;
  body["object"] = "list";
  body["data"] = ojson::array({std::move(m)});
  send_json(res, 200, body);
}

void HttpServer::metrics(const httplib::Request&, httplib::Response& res) {
  GaugeValues g;
  g.ready = ready_.load();
  if (g.ready) {
    EngineStats s = engine_->stats();
    g.running = s.running;
    g.waiting = s.waiting;
    g.kv_tokens_used = s.kv_tokens_used;
    g.kv_tokens_total = s.kv_tokens_total;
    g.kv_bytes_used = s.kv_bytes_used;
    g.kv_bytes_total = s.kv_bytes_total;
    g.kv_blocks_used = s.kv_blocks_used;
    g.kv_blocks_total = s.kv_blocks_total;
    g.prefix_cache_hit_tokens = s.prefix_hit_tokens;
    g.prefix_cache_query_tokens = s.prefix_query_tokens;
    g.preemptions = s.preemptions;
    g.engine_steps = s.steps;
    g.weight_bytes = model_->weight_bytes();
  }
  g.resident_bytes = resident_memory_bytes();
  g.planned_resident_bytes = planned_resident_.load();
  res.status = 200;
  res.set_content(metrics_.exposition(g), "text/plain; version=0.0.4; charset=utf-8");
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) {
  std::vector<int32_t> ids = parse_tokenize_request(parse_json_body(req.body), served_);
  ojson body;
  body["tokens"] = ids;
  body["count"] = ids.size();
  body["max_model_len"] = served_.max_context;
  send_json(res, 200, body);
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) {
  std::vector<int32_t> ids = parse_detokenize_request(parse_json_body(req.body), served_);
  ojson body;
  body["prompt"] = tokenizer_->decode(ids, /*skip_special_tokens=*/false);
  send_json(res, 200, body);
}

// ---- generation ----------------------------------------------------------------------------------------------

// Called with ex.mutex held.
void HttpServer::finish_sequence(Exchange& ex, size_t index, const std::string& reason, Clock::time_point now) {
  Sequence& s = ex.sequences[index];
  if (s.finished) return;
  s.finished = true;
  s.end = now;
  s.finish_reason = reason;
  --ex.unfinished;
  if (ex.discarded) return;
  std::optional<double> ttft, tpot;
  if (s.first_token) {
    ttft = seconds(*s.first_token - ex.arrival);
    if (s.generated > 1) tpot = seconds(now - *s.first_token) / static_cast<double>(s.generated - 1);
  }
  metrics_.sequence_finished(reason, ex.prompt_tokens, s.generated, ttft, tpot, seconds(now - ex.arrival));
}

EventSink HttpServer::sink_for(const std::shared_ptr<Exchange>& ex, size_t index) {
  return [this, ex, index](EngineEvent&& event) -> bool {
    const auto now = Clock::now();
    std::lock_guard lock(ex->mutex);
    Sequence& s = ex->sequences[index];
    if (ex->client_gone || s.finished) return false;
    if (!event.tokens.empty()) {
      const auto k = static_cast<int64_t>(event.tokens.size());
      // The first token's own gap is the TTFT; tokens that came with it came after no wait.
      if (!ex->discarded) metrics_.tokens_after_first(s.last_token ? seconds(now - *s.last_token) : 0.0,
                                                      s.last_token ? k : k - 1);
      if (!s.first_token) s.first_token = now;
      s.last_token = now;
    }
    s.generated += static_cast<int64_t>(event.tokens.size());
    if (event.finished) {
      if (event.completion_tokens > 0) s.generated = event.completion_tokens;
      finish_sequence(*ex, index, event.finish_reason.empty() ? "stop" : event.finish_reason, now);
    }
    ex->events.emplace_back(index, std::move(event));
    ex->cv.notify_all();
    return true;
  };
}

// The client went away (a write failed): unfinished sequences are aborted and the engine frees their slots.
void HttpServer::client_gone(Exchange& ex) {
  std::vector<uint64_t> cancel;
  {
    std::lock_guard lock(ex.mutex);
    if (ex.client_gone) return;
    ex.client_gone = true;
    const auto now = Clock::now();
    for (size_t i = 0; i < ex.sequences.size(); ++i) {
      if (ex.sequences[i].finished) continue;
      if (ex.sequences[i].submitted) cancel.push_back(ex.sequences[i].engine_id);
      finish_sequence(ex, i, "abort", now);
    }
  }
  for (uint64_t id : cancel) engine_->cancel(id);
}

// Past the drain grace, whatever the engine has not finished is answered as aborted. Called with ex.mutex held.
void HttpServer::abandon_unfinished(Exchange& ex) {
  const auto now = Clock::now();
  for (size_t i = 0; i < ex.sequences.size(); ++i) {
    if (ex.sequences[i].finished) continue;
    finish_sequence(ex, i, "abort", now);
    EngineEvent e;
    e.finished = true;
    e.finish_reason = "abort";
    ex.events.emplace_back(i, std::move(e));
  }
}

void HttpServer::log_request(Exchange& ex) {
  std::lock_guard lock(ex.mutex);
  std::optional<Clock::time_point> first;
  Clock::time_point end = ex.arrival;
  int64_t generated = 0;
  std::string outcome;
  for (const Sequence& s : ex.sequences) {
    if (s.first_token && (!first || *s.first_token < *first)) first = s.first_token;
    if (s.finished && s.end > end) end = s.end;
    generated += s.generated;
    if (outcome.find(s.finish_reason) == std::string::npos) outcome += (outcome.empty() ? "" : ",") + s.finish_reason;
  }
  const std::string reasons = outcome;
  if (ex.client_gone) outcome += " (client gone)";
  const double decode = first ? seconds(end - *first) : 0;
  const double tokens_per_s = decode > 0 && generated > 1 ? (generated - 1) / decode : 0.0;
  const double latency = seconds(end - ex.arrival);
  const std::optional<double> ttft = first ? std::optional(seconds(*first - ex.arrival)) : std::nullopt;
  ojson fields = {{"id", ex.id}, {"path", ex.path}, {"n", ex.sequences.size()}, {"prompt_tokens", ex.prompt_tokens},
                  {"completion_tokens", generated}, {"ttft_s", ttft ? ojson(*ttft) : ojson(nullptr)},
                  {"tokens_per_s", tokens_per_s}, {"latency_s", latency}, {"outcome", reasons},
                  {"client_gone", ex.client_gone}};
  log_.write("request",
             fmt::format("{} {} n={} prompt={} completion={} ttft={} {:.1f} tok/s {:.3f} s outcome={}", ex.id, ex.path,
                         ex.sequences.size(), ex.prompt_tokens, generated,
                         ttft ? fmt::format("{:.3f} s", *ttft) : std::string("-"), tokens_per_s, latency, outcome),
             std::move(fields));
}

void HttpServer::generate(const httplib::Request& req, httplib::Response& res, ApiKind kind) {
  auto ex = std::make_shared<Exchange>();
  ex->id = new_request_id(kind);
  ex->path = req.path;
  ex->arrival = Clock::now();
  ex->created = unix_seconds();

  CompletionRequest request;
  try {
    json body = parse_json_body(req.body);
    request = kind == ApiKind::Chat ? parse_chat_request(body, served_) : parse_completion_request(body, served_);
    ex->prompt_tokens = request.prompt_tokens;
    ex->sequences.resize(request.choices.size());
    ex->unfinished = request.choices.size();

    for (size_t i = 0; i < request.choices.size(); ++i) {
      SubmitResult r = engine_->submit(request.choices[i], sink_for(ex, i));
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
      const std::string prompt_param = kind == ApiKind::Chat ? "messages" : "prompt";
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
  } catch (const ApiError& e) {
    metrics_.request_rejected();
    log_.write("rejected", fmt::format("{} {} rejected {}: {}", ex->id, ex->path, e.status(), e.what()),
               {{"id", ex->id}, {"path", ex->path}, {"status", e.status()}, {"error", e.what()}}, "warning");
    throw;
  }

  ++active_;
  if (request.stream) {
    auto sse = std::make_shared<SseStream>(request, served_, ex->id, ex->created);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ex, sse](size_t, httplib::DataSink& sink) -> bool {
          auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
          bool first_call;
          {
            std::lock_guard lock(ex->mutex);
            first_call = !ex->stream_started;
            ex->stream_started = true;
          }
          if (first_call && !write(sse->start())) {
            client_gone(*ex);
            return false;
          }
          std::deque<std::pair<size_t, EngineEvent>> batch;
          {
            std::unique_lock lock(ex->mutex);
            while (ex->events.empty() && ex->unfinished > 0) {
              if (abandon_.load()) {
                abandon_unfinished(*ex);
                break;
              }
              ex->cv.wait_for(lock, std::chrono::milliseconds(200));
            }
            batch.swap(ex->events);
          }
          for (auto& [index, event] : batch) {
            if (!write(sse->event(index, event))) {
              client_gone(*ex);
              return false;
            }
          }
          bool done;
          {
            std::lock_guard lock(ex->mutex);
            done = ex->unfinished == 0 && ex->events.empty();
          }
          if (done) {
            if (!write(sse->finish())) {
              client_gone(*ex);
              return false;
            }
            sink.done();
          }
          return true;
        },
        [this, ex](bool success) {
          if (!success) client_gone(*ex);
          log_request(*ex);
          --active_;
        });
    return;
  }

  // Not streaming: wait for every choice, then answer at once.
  std::vector<ChoiceResult> results(request.choices.size());
  {
    std::unique_lock lock(ex->mutex);
    for (;;) {
      while (!ex->events.empty()) {
        auto [index, event] = std::move(ex->events.front());
        ex->events.pop_front();
        ChoiceResult& c = results[index];
        c.text += event.text;
        c.completion_tokens += static_cast<int64_t>(event.tokens.size());
        for (auto& t : event.tokens) c.tokens.push_back(std::move(t));
        if (event.finished) {
          c.finish_reason = event.finish_reason.empty() ? "stop" : event.finish_reason;
          c.error = event.error;
          if (event.completion_tokens > 0) c.completion_tokens = event.completion_tokens;
        }
      }
      if (ex->unfinished == 0) break;
      if (abandon_.load()) {
        abandon_unfinished(*ex);
        continue;
      }
      ex->cv.wait_for(lock, std::chrono::milliseconds(200));
    }
  }
  log_request(*ex);
  --active_;
  for (const ChoiceResult& c : results)
    if (c.finish_reason == "error")
      throw ApiError(500, c.error.empty() ? "generation failed" : c.error, "", "server_error");
  send_json(res, 200, completion_response(request, served_, ex->id, ex->created, results));
}

// ---- lifecycle -----------------------------------------------------------------------------------------------

// The plan `qatserve plan --model DIR --device cpu` prints, with the engine's prefill chunk and batch: without
// --kv-memory the KV pool comes from it (memory_plan.h, default_kv_budget), and /metrics sets resident memory
// beside it.
MemoryPlan serve_plan(const Gemma4Model& model, const EngineOptions& engine) {
  PlanOptions po;
  po.device = resolve_device("cpu");
  po.prefill_chunk = engine.prefill_chunk;
  po.batch = engine.max_running;
  WeightBytes weights = weight_bytes_from_checkpoint(model.checkpoint(), model.config());
  if (model.lm_head().kind == WeightKind::Int4) weights.add_int4_lm_head(model.lm_head().bytes());
  return plan_memory(model.config(), weights, po);
}

// Room for max_running contexts of the served length (--max-model-len, else the model's), within the plan.
uint64_t planned_kv_bytes(const MemoryPlan& plan, const Gemma4Model& model, const EngineOptions& engine) {
  const int64_t context =
      engine.max_context > 0 ? engine.max_context : model.config().text.max_position_embeddings_or(8192);
  const uint64_t bytes = default_kv_budget(plan, engine.max_running, context);
  if (bytes == 0)
    throw Error(fmt::format("the memory plan for this machine ({} bytes: {}) leaves nothing for the KV cache; give "
                            "--kv-memory", plan.device.bytes, plan.device.note));
  return bytes;
}

// --max-model-len: a cap at or below the model's own context.
int64_t checked_max_model_len(int64_t requested, const Gemma4TextConfig& text) {
  if (requested < 0) throw Error(fmt::format("--max-model-len {}: expected a positive number of tokens", requested));
  if (requested > 0 && text.max_position_embeddings > 0 && requested > text.max_position_embeddings)
    throw Error(fmt::format("--max-model-len {} is longer than the model's context (max_position_embeddings {} in "
                            "config.json)", requested, text.max_position_embeddings));
  return requested;
}

void HttpServer::configure_engine(EngineOptions& eo) {
  eo.max_running = o_.max_running;
  eo.max_waiting = o_.max_waiting;
  eo.max_context = checked_max_model_len(o_.max_model_len, model_->config().text);
}

void HttpServer::load() {
  const auto t0 = Clock::now();
  // The progress line is for people; a JSON log stays one object per line (the "loaded" event has the time).
  model_ = Gemma4Model::load(o_.model_dir, parse_precision(o_.precision), log_.format() == LogFormat::Text);
  const auto tokenizer_path = o_.model_dir / "tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path))
    throw Error(fmt::format("{}: no tokenizer.json, which serve needs", o_.model_dir.string()));
  tokenizer_ = Tokenizer::load(tokenizer_path);
  GenerationConfig generation = read_generation_config(o_.model_dir);
  EngineOptions eo;
  configure_engine(eo);
  const MemoryPlan plan = serve_plan(*model_, eo);
  eo.kv_bytes = o_.kv_memory ? o_.kv_memory : planned_kv_bytes(plan, *model_, eo);
  try {
    engine_ = std::make_unique<Engine>(*model_, &*tokenizer_, generation, eo);
  } catch (const Error& e) {
    if (!o_.kv_memory) throw;
    throw Error(fmt::format("--kv-memory {}: {}", o_.kv_memory, e.what()));
  }
  if (o_.max_model_len > 0 && engine_->max_context() < o_.max_model_len)
    throw Error(fmt::format("--max-model-len {}: the KV pool ({} bytes, {}) holds only {} positions for one sequence; "
                            "give a larger --kv-memory or a smaller --max-model-len", o_.max_model_len,
                            engine_->stats().kv_bytes_total, o_.kv_memory ? "--kv-memory" : plan.device.note,
                            engine_->max_context()));
  served_.name = model_name_;
  served_.strict_name = !o_.served_model_name.empty();
  served_.tokenizer = &*tokenizer_;
  served_.generation = generation;
  served_.dialect = gemma4_chat_dialect_for_checkpoint(o_.model_dir, model_->config().text);
  served_.max_context = engine_->max_context();
  served_.vocab_size = model_->config().text.vocab_size;
  const EngineStats s = engine_->stats();
  planned_resident_ = plan.cpu_resident_without_kv() + s.kv_bytes_total;
  const double load_s = seconds(Clock::now() - t0);
  log_.write("loaded",
             fmt::format("loaded {} ({} weights, {} activations, {} bytes of weights, context {}) in {:.2f} s",
                         o_.model_dir.string(), model_->int4_weights() ? "int4" : "bf16",
                         precision_name(model_->precision()), model_->weight_bytes(), served_.max_context, load_s),
             {{"model_dir", o_.model_dir.string()}, {"weights", model_->int4_weights() ? "int4" : "bf16"},
              {"activations", precision_name(model_->precision())}, {"weight_bytes", model_->weight_bytes()},
              {"max_model_len", served_.max_context}, {"load_s", load_s},
              {"threads", ThreadPool::shared().size()}});
  const std::string kv_source =
      o_.kv_memory ? "--kv-memory" : fmt::format("from the memory plan of {} bytes: {}", plan.device.bytes, plan.device.note);
  log_.write("kv_pool",
             fmt::format("KV pool {} bytes ({}), {} blocks, {} KV, {} positions for the full-attention layers",
                         s.kv_bytes_total, kv_source, s.kv_blocks_total, engine_->kv_dtype(), s.kv_tokens_total),
             {{"kv_bytes", s.kv_bytes_total}, {"source", kv_source}, {"blocks", s.kv_blocks_total},
              {"kv_dtype", engine_->kv_dtype()}, {"positions", s.kv_tokens_total}});
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
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write must be a failed write, not the end of the process
  const int threads = o_.http_threads > 0 ? o_.http_threads : o_.max_running + o_.max_waiting + 16;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_.set_payload_max_length(o_.max_body_bytes);
  http_.set_read_timeout(30, 0);
  http_.set_write_timeout(10, 0);
  // An idle keep-alive connection holds its thread this long, and shutdown waits for it: keep it short.
  http_.set_keep_alive_timeout(2);
  http_.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second server take the same port.
  http_.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  add_routes();
  ThreadPool::set_shared_threads(o_.threads);  // before the model's first parallel_for creates the pool
  if (!http_.bind_to_port(o_.host, o_.port))
    throw Error(fmt::format("cannot listen on {}:{} (address in use, or not an address of this machine?)", o_.host,
                            o_.port));
  std::atomic<bool> listening{true};
  std::thread listener([this, &listening] {
    http_.listen_after_bind();
    listening = false;
  });
  log_.write("listening",
             fmt::format("listening on http://{}:{}/ ({} connection threads); loading {}", o_.host, o_.port, threads,
                         o_.model_dir.string()),
             {{"host", o_.host}, {"port", o_.port}, {"connection_threads", threads},
              {"model_dir", o_.model_dir.string()}});

  try {
    load();
    if (!interrupted()) warm_up();
  } catch (...) {
    http_.stop_accepting();  // unlike stop(), also right when the accept loop has not started yet
    listener.join();
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
  while (!interrupted() && listening.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // Nothing new gets in before the count below, so the log says exactly what the drain has to finish.
  http_.stop_accepting();
  if (engine_) engine_->stop_accepting();
  const EngineStats left = engine_ ? engine_->stats() : EngineStats{};
  const double grace = std::chrono::duration<double>(o_.drain_grace).count();
  log_.write("draining",
             fmt::format("shutting down: no new connections; finishing {} running and {} waiting sequences (up to {:g} "
                         "s)", left.running, left.waiting, grace),
             {{"running", left.running}, {"waiting", left.waiting}, {"drain_timeout_s", grace}});
  if (engine_) engine_->drain(o_.drain_grace);
  // The engine has finished or aborted everything; give the connection threads a moment to send the last
  // events, then stop anything still waiting.
  for (int i = 0; i < 40 && active_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  abandon_ = true;
  listener.join();
  ready_ = false;
  engine_.reset();
  log_.write("stopped", "stopped");
  return 0;
}

}  // namespace

std::string resolve_api_key(const std::string& flag_key, const std::filesystem::path& key_file, const char* env) {
  if (!flag_key.empty()) return flag_key;
  if (key_file.empty()) return env ? env : "";
  std::string key;
  try {
    key = read_file(key_file);
  } catch (const Error& e) {
    throw Error(fmt::format("--api-key-file: {}", e.what()));
  }
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
    key.pop_back();
  if (key.empty()) throw Error(fmt::format("--api-key-file {}: the file is empty; expected the key on one line",
                                           key_file.string()));
  if (key.find('\n') != std::string::npos)
    throw Error(fmt::format("--api-key-file {}: expected the key on one line, found several", key_file.string()));
  return key;
}

int run_server(const ServeOptions& options) {
  HttpServer server(options);
  return server.run();
}

}  // namespace qs
