#include "server/http_transport.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "server/openai_protocol.h"
#include "server/server_log.h"
#include "util/error.h"

namespace qs {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kHeaderLimit = 16 * 1024;                    // larger headers: 431
constexpr auto kLingerTime = std::chrono::seconds(2);         // reading what a closed request still sends
constexpr auto kRefusalWriteTime = std::chrono::seconds(2);   // a refused client gets this long to take its 503
constexpr int kSpareDescriptors = 64;                         // model files, logs, the engine: not connections

using RequestParser = http::request_parser<http::string_body>;

void configure(RequestParser& parser, size_t max_body_bytes) {
  parser.header_limit(kHeaderLimit);
  parser.body_limit(max_body_bytes);
}

HttpResponse parse_error_response(const beast::error_code& ec, size_t max_body_bytes) {
  if (ec == http::error::body_limit)
    return http_error_response(413, fmt::format("the request body is larger than the limit of {} bytes", max_body_bytes));
  if (ec == http::error::header_limit)
    return http_error_response(431, fmt::format("the request header is larger than the limit of {} bytes", kHeaderLimit));
  return http_error_response(400, fmt::format("malformed HTTP request: {}", ec.message()));
}

HttpRequest to_request(const http::request<http::string_body>& message) {
  HttpRequest r;
  r.method = std::string(message.method_string());
  const std::string_view target(message.target().data(), message.target().size());
  r.path = std::string(target.substr(0, target.find('?')));
  const auto authorization = message[http::field::authorization];
  r.authorization.assign(authorization.data(), authorization.size());
  const auto request_id = message["X-Request-Id"];
  r.request_id.assign(request_id.data(), request_id.size());
  const auto api_key = message["x-api-key"];
  r.api_key.assign(api_key.data(), api_key.size());
  const auto content_type = message[http::field::content_type];
  r.content_type.assign(content_type.data(), content_type.size());
  r.body = message.body();
  return r;
}

// The status line and headers; a body of `content_length` bytes follows, or chunks when there is none.
std::string head_bytes(const HttpResponse& r, std::optional<size_t> content_length, bool keep_alive, bool http10) {
  const auto reason = http::obsolete_reason(http::int_to_status(r.status));
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", r.status,
                                std::string_view(reason.data(), reason.size()), r.content_type);
  for (const auto& [name, value] : r.headers) out += fmt::format("{}: {}\r\n", name, value);
  if (content_length) out += fmt::format("Content-Length: {}\r\n", *content_length);
  else if (!http10) out += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  else if (http10) out += "Connection: keep-alive\r\n";
  out += "\r\n";
  return out;
}

void append_chunk(std::string& out, std::string_view data, bool chunked) {
  if (data.empty()) return;
  if (!chunked) {
    out += data;
    return;
  }
  out += fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
}

// The soft open-file limit raised to the hard one; returns how many descriptors connections may use.
int64_t raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024 - kSpareDescriptors;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return INT64_MAX;
  return static_cast<int64_t>(limit.rlim_cur) - kSpareDescriptors;
}

}  // namespace

HttpResponse http_error_response(int status, std::string_view message) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(error_body(message, status >= 500 ? "server_error" : "invalid_request_error"));
  return r;
}

ParsedRequest parse_http_request(std::string_view bytes, size_t max_body_bytes) {
  RequestParser parser;
  configure(parser, max_body_bytes);
  parser.eager(true);
  ParsedRequest out;
  net::const_buffer rest(bytes.data(), bytes.size());
  while (!parser.is_done()) {
    beast::error_code ec;
    const size_t used = parser.put(rest, ec);
    if (ec == http::error::need_more || (!ec && used == 0)) {
      out.incomplete = true;
      return out;
    }
    if (ec) {
      out.error = parse_error_response(ec, max_body_bytes);
      return out;
    }
    rest += used;
  }
  out.request = to_request(parser.get());
  return out;
}

// ---- the transport ----------------------------------------------------------------------------------------------

class Session;

struct HttpTransport::Impl {
  Impl(TransportOptions o, HttpHandler h, const ServerLog& l) : options(std::move(o)), handler(std::move(h)), log(l) {}

  TransportOptions options;
  HttpHandler handler;
  const ServerLog& log;

  std::atomic<int64_t> open{0}, refused{0}, timed_out{0}, busy{0};
  std::atomic<bool> stopping{false};
  std::unordered_set<Session*> sessions;  // I/O thread only
  Clock::time_point last_refusal_log{};
  int64_t refusals_unlogged = 0;

  // Declared last: destroyed first, with every handler (and so every session) it still holds.
  std::optional<net::io_context> io{std::in_place, 1};
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_backoff;
  std::thread thread;

  void accept();
  void on_accept(const beast::error_code& ec, tcp::socket socket);
  void refuse(tcp::socket socket, std::string reason);
  void close_idle_sessions();
};

// One connection: reads requests one after another, answers each, and holds the socket between them.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpTransport::Impl& server, bool counted)
      : stream_(std::move(socket)), server_(server), counted_(counted) {
    if (counted_) {
      server_.sessions.insert(this);
      ++server_.open;
    }
  }
  ~Session() {
    if (source_) source_->client_gone();  // the transport stopped with the response unfinished
    set_busy(false);
    if (counted_) {
      server_.sessions.erase(this);
      --server_.open;
    }
  }

  void start() { read_request(); }
  void refuse(HttpResponse response) {
    set_busy(true);
    keep_alive_ = false;
    send_whole(response, kRefusalWriteTime);
  }
  // Closes the connection if it waits for a request (the server is draining).
  void close_if_idle() {
    if (!idle_) return;
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

 private:
  void set_busy(bool busy) {
    if (busy == busy_) return;
    busy_ = busy;
    busy ? ++server_.busy : --server_.busy;
  }

  void read_request() {
    idle_ = true;
    set_busy(false);
    parser_.emplace();
    configure(*parser_, server_.options.max_body_bytes);
    stream_.expires_after(server_.options.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    idle_ = false;
    if (ec) return read_failed(ec);
    set_busy(true);
    const auto& message = parser_->get();
    http10_ = message.version() < 11;
    if (beast::iequals(message[http::field::expect], "100-continue")) {
      // The client waits for this before it sends the body.
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(server_.options.body_timeout);
      net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    stream_.expires_after(server_.options.body_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void read_failed(const beast::error_code& ec) {
    if (ec == beast::error::timeout) {
      ++server_.timed_out;  // the stream closed the socket
      return;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::bad_descriptor || ec == http::error::partial_message)
      return close();
    set_busy(true);
    keep_alive_ = false;
    const HttpResponse error = parse_error_response(ec, server_.options.max_body_bytes);
    server_.log.write("http_error", fmt::format("bad request -> {}: {}", error.status, ec.message()),
                      {{"status", error.status}, {"error", ec.message()}}, "warning");
    send_whole(error, server_.options.write_timeout);
  }

  void on_body(beast::error_code ec) {
    if (ec) return read_failed(ec);
    stream_.expires_never();
    keep_alive_ = parser_->get().keep_alive() && !server_.stopping.load();
    HttpRequest request = to_request(parser_->get());
    parser_.reset();
    HttpReply reply;
    try {
      reply = server_.handler(request);
    } catch (const std::exception& e) {
      reply = {http_error_response(500, e.what()), nullptr};
    }
    if (!reply.source) return send_whole(reply.response, server_.options.write_timeout);
    source_ = std::move(reply.source);
    head_sent_ = false;
    watch_client();
    std::weak_ptr<Session> weak = weak_from_this();
    auto executor = stream_.get_executor();
    source_->subscribe([weak, executor, flag = wake_posted_] {
      if (flag->exchange(true)) return;  // one pending pump serves every wake before it
      net::post(executor, [weak, flag] {
        flag->store(false);
        if (auto self = weak.lock()) self->pump();
      });
    });
    pump();
  }

  // ---- responses ----

  void send_whole(const HttpResponse& response, std::chrono::steady_clock::duration write_time) {
    if (server_.stopping.load()) keep_alive_ = false;
    pending_ += head_bytes(response, response.body.size(), keep_alive_, http10_);
    pending_ += response.body;
    response_complete_ = true;
    write_time_ = write_time;
    flush();
  }

  // What the source has now, written out.
  void pump() {
    if (!source_ || closed_) return;
    SourceStep step = source_->next();
    if (step.head) {
      if (step.done) {
        step.head->body += step.data;
        step.data.clear();
      }
      if (server_.stopping.load() || (!step.done && http10_)) keep_alive_ = false;  // HTTP/1.0: no chunks
      chunked_ = !step.done && !http10_;
      pending_ += head_bytes(*step.head, step.done ? std::optional(step.head->body.size()) : std::nullopt,
                             keep_alive_, http10_);
      if (step.done) pending_ += step.head->body;
      else append_chunk(pending_, step.head->body, chunked_);
      head_sent_ = true;
    }
    if (head_sent_) append_chunk(pending_, step.data, chunked_);
    if (step.done) {
      if (chunked_ && !step.head) pending_ += "0\r\n\r\n";
      response_complete_ = true;
      source_.reset();  // done: its request is over
      watching_ = false;
    }
    write_time_ = server_.options.write_timeout;
    flush();
  }

  void flush() {
    if (writing_ || closed_ || pending_.empty()) return;
    out_.swap(pending_);
    pending_.clear();
    writing_ = true;
    stream_.expires_after(write_time_);
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_written(ec);
    });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    out_.clear();
    // Counted before the closed_ test: a write timeout also ends the client watch, whose handler may close first.
    if (ec == beast::error::timeout) ++server_.timed_out;
    if (closed_) return;
    if (ec) return client_gone();
    stream_.expires_never();
    if (!pending_.empty()) return flush();
    if (!response_complete_) return;  // the source wakes us
    response_complete_ = false;
    stop_watching();
    if (keep_alive_ && !server_.stopping.load()) return read_request();
    linger();
  }

  // ---- the client, watched while the engine works ----

  // A readable socket while the request runs: the client closed it (or reset it), or sent the next request.
  void watch_client() {
    watching_ = true;
    const uint64_t id = ++watch_id_;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id](beast::error_code ec) {
      self->on_readable(ec, id);
    });
  }

  void on_readable(const beast::error_code& ec, uint64_t id) {
    if (id != watch_id_ || !watching_ || closed_) return;
    if (ec) return client_gone();
    char byte;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return client_gone();
    if (n < 0) return watch_client();
    watching_ = false;  // a pipelined request: read after this response; its arrival says the client is there
  }

  void stop_watching() {
    if (!watching_) return;
    watching_ = false;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);  // nothing else is pending now
  }

  void client_gone() {
    if (source_) {
      auto source = std::move(source_);
      source->client_gone();
    }
    close();
  }

  // ---- closing ----

  // Half-closes, then reads (and drops) what the client still sends for a moment, so that the response is not
  // lost to a reset when the request was not read to its end (a 413, a refusal).
  void linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTime);
    drain_input();
  }

  void drain_input() {
    scratch_.resize(16 * 1024);
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_input();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    idle_ = false;
    set_busy(false);
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpTransport::Impl& server_;
  const bool counted_;  // a refused connection is not one of the held ones
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  std::shared_ptr<ResponseSource> source_;
  std::shared_ptr<std::atomic<bool>> wake_posted_ = std::make_shared<std::atomic<bool>>(false);
  std::string out_, pending_, scratch_;
  std::chrono::steady_clock::duration write_time_{};
  bool idle_ = false, busy_ = false, keep_alive_ = true, http10_ = false, chunked_ = false, head_sent_ = false;
  bool writing_ = false, response_complete_ = false, watching_ = false, closed_ = false;
  uint64_t watch_id_ = 0;
};

void HttpTransport::Impl::accept() {
  acceptor->async_accept([this](beast::error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void HttpTransport::Impl::on_accept(const beast::error_code& ec, tcp::socket socket) {
  if (!acceptor->is_open()) return;
  if (ec) {
    if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory) {
      // The connection stays in the backlog; retry once something is closed.
      ++refused;
      log.write("http_error", fmt::format("accept failed: {}; retrying in 100 ms", ec.message()),
                {{"error", ec.message()}}, "warning");
      accept_backoff->expires_after(std::chrono::milliseconds(100));
      accept_backoff->async_wait([this](beast::error_code) {
        if (acceptor->is_open()) accept();
      });
      return;
    }
    return accept();
  }
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  if (open.load() >= options.max_connections)
    refuse(std::move(socket), fmt::format("the server holds its limit of {} connections (--max-connections); retry "
                                          "later", options.max_connections));
  else
    std::make_shared<Session>(std::move(socket), *this, true)->start();
  accept();
}

void HttpTransport::Impl::refuse(tcp::socket socket, std::string reason) {
  ++refused;
  ++refusals_unlogged;
  // One line a second at most: a flood of refusals must not become a flood of log lines.
  const auto now = Clock::now();
  if (now - last_refusal_log >= std::chrono::seconds(1)) {
    log.write("refused", fmt::format("refused {} connection(s): {}", refusals_unlogged, reason),
              {{"connections", refusals_unlogged}, {"open", open.load()}, {"max_connections", options.max_connections}},
              "warning");
    last_refusal_log = now;
    refusals_unlogged = 0;
  }
  HttpResponse response = http_error_response(503, reason);
  response.headers.emplace_back("Retry-After", "1");
  std::make_shared<Session>(std::move(socket), *this, false)->refuse(std::move(response));
}

void HttpTransport::Impl::close_idle_sessions() {
  // close_if_idle never destroys a session here: its pending read holds it until the handler runs.
  for (Session* s : sessions) s->close_if_idle();
}

HttpTransport::HttpTransport(TransportOptions options, HttpHandler handler, const ServerLog& log)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler), log)) {
  Impl& s = *impl_;
  const int64_t descriptors = raise_descriptor_limit();
  if (s.options.max_connections > descriptors) {
    log.write("max_connections",
              fmt::format("--max-connections {} lowered to {}: the open-file limit (ulimit -n) holds no more",
                          s.options.max_connections, descriptors),
              {{"requested", s.options.max_connections}, {"max_connections", descriptors}}, "warning");
    s.options.max_connections = static_cast<int>(std::max<int64_t>(descriptors, 1));
  }
  beast::error_code ec;
  const auto address = net::ip::make_address(s.options.host, ec);
  if (ec)
    throw Error(fmt::format("cannot listen on {}:{}: '{}' is not an IP address", s.options.host, s.options.port,
                            s.options.host));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
  s.acceptor.emplace(*s.io);
  s.accept_backoff.emplace(*s.io);
  // SO_REUSEADDR (a restart need not wait for TIME_WAIT) but not SO_REUSEPORT: a second server must not share the port.
  s.acceptor->open(endpoint.protocol(), ec);
  if (!ec) s.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(endpoint, ec);
  if (!ec) s.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error(fmt::format("cannot listen on {}:{}: {} (address in use, or not an address of this machine?)",
                            s.options.host, s.options.port, ec.message()));
}

HttpTransport::~HttpTransport() {
  Impl& s = *impl_;
  if (s.thread.joinable()) {
    s.io->stop();
    s.thread.join();
  }
  s.accept_backoff.reset();
  s.acceptor.reset();
  s.io.reset();  // destroys the handlers still pending, and with them the sessions
}

void HttpTransport::start() {
  Impl& s = *impl_;
  s.accept();
  s.thread = std::thread([&s] { s.io->run(); });
}

void HttpTransport::stop_accepting() {
  Impl& s = *impl_;
  s.stopping = true;
  beast::error_code ignored;
  if (!s.thread.joinable()) {
    s.acceptor->close(ignored);
    return;
  }
  std::promise<void> done;
  net::post(*s.io, [&s, &done] {
    beast::error_code ignored;
    s.acceptor->close(ignored);
    s.accept_backoff->cancel();
    s.close_idle_sessions();
    done.set_value();
  });
  done.get_future().wait();
}

bool HttpTransport::wait_idle(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (impl_->busy.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int HttpTransport::max_connections() const { return impl_->options.max_connections; }

TransportStats HttpTransport::stats() const {
  return {impl_->open.load(), impl_->refused.load(), impl_->timed_out.load()};
}

}  // namespace qs
