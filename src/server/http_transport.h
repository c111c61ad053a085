#pragma once
// The HTTP/1.1 transport of `serve`: Boost.Beast over Boost.Asio, event-driven. One I/O thread holds every
// connection (an idle or slow one costs a socket and a few KB, not a thread), so thousands of them never stop
// /health from answering. It reads each request under a header deadline and a body deadline, refuses connections
// past a limit with a 503 and closes them, and hands each request to one handler, which answers at once or returns
// a ResponseSource: a response the engine thread produces later (SSE streams, and non-streaming generations). While
// a source is pending the client's socket is watched, so a client that closes its connection aborts its request at
// once, streaming or not. The handler runs on the I/O thread: it must not run model compute or block.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qs {

class ServerLog;

struct HttpRequest {
  std::string method;         // "GET", "POST", ... as sent
  std::string path;           // the target without its query string
  std::string authorization;  // the Authorization header; empty when absent
  std::string request_id;     // the X-Request-Id header (benchmark clients' and proxies' correlation id); may be empty
  std::string api_key;        // the x-api-key header (Anthropic's clients send the key there); empty when absent
  std::string content_type;   // the Content-Type header (a multipart upload's boundary is there); empty when absent
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // beside Content-Type, Content-Length, Connection
  std::string body;
};

// One step of a response produced off the I/O thread.
struct SourceStep {
  std::optional<HttpResponse> head;  // the status and headers, once, first; its body is the first bytes sent
  std::string data;                  // body bytes after those
  bool done = false;                 // nothing more will come
};

// A response the engine produces: the transport sends what next() yields as it comes. A source done at its first
// yield is sent with a Content-Length; one that yields its head and more later is sent chunked.
class ResponseSource {
 public:
  virtual ~ResponseSource() = default;
  // Called once, on the I/O thread, before next(): `wake` may then be called from any thread whenever next() may
  // have something new (it only schedules next() on the I/O thread).
  virtual void subscribe(std::function<void()> wake) = 0;
  virtual SourceStep next() = 0;    // on the I/O thread
  virtual void client_gone() = 0;   // the client closed the connection or stopped reading; on the I/O thread
};

struct HttpReply {
  HttpResponse response;                   // the whole answer when `source` is null
  std::shared_ptr<ResponseSource> source;  // else the answer, later
};

// May move the request's body away (a generation request hands it to a worker without copying it).
using HttpHandler = std::function<HttpReply(HttpRequest&)>;

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  size_t max_body_bytes = 8u << 20;                      // larger: 413
  std::chrono::milliseconds header_timeout{10000};       // connection (or last response) -> whole header
  std::chrono::milliseconds body_timeout{30000};         // header -> whole body
  std::chrono::milliseconds write_timeout{30000};        // a client that reads nothing for this long is dropped
  int max_connections = 4096;                            // past it: 503 and close
};

struct TransportStats {
  int64_t open = 0;       // connections held now
  int64_t refused = 0;    // refused past --max-connections (or out of file descriptors)
  int64_t timed_out = 0;  // closed for a header or body not read in time, or a client not reading
};

// What a transport-level error answers: an OpenAI-shaped JSON error body (openai_protocol.h), Connection: close.
HttpResponse http_error_response(int status, std::string_view message);

// Raw bytes as one request, through the same parser and limits the connections use (no socket): the request, or
// the error response the transport would send. For the fuzz target and tests; `bytes` must hold the whole request.
struct ParsedRequest {
  std::optional<HttpRequest> request;
  HttpResponse error;      // when !request and !incomplete
  bool incomplete = false;  // the bytes ended before the request did
};
ParsedRequest parse_http_request(std::string_view bytes, size_t max_body_bytes);

class HttpTransport {
 public:
  // Binds and listens (backlog SOMAXCONN) at once; throws qs::Error naming the address when it cannot. Raises the
  // soft open-file limit to the hard one; when that still cannot hold max_connections, the limit is lowered to
  // what it can hold, and the log says so.
  HttpTransport(TransportOptions options, HttpHandler handler, const ServerLog& log);
  ~HttpTransport();  // stops the I/O thread; every connection is closed
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  void start();           // the I/O thread starts accepting
  void stop_accepting();  // closes the listener and the connections waiting for a request; requests in flight go on
  // Waits until no connection is in a request (at most `timeout`); true when none is.
  bool wait_idle(std::chrono::milliseconds timeout);
  int max_connections() const;
  TransportStats stats() const;

  struct Impl;  // the I/O thread's state (http_transport.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qs
