#pragma once
// The generation requests in flight, between the routes that start them and the connections that answer them:
// each sequence's timings go to the metrics as its tokens arrive, each request logs one line when its connection
// is done with it, a client that goes away cancels its sequences in the engine, and past the drain grace every
// unfinished sequence is answered as aborted.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/exchange.h"
#include "server/metrics.h"
#include "server/server_log.h"

namespace qs {

class InFlightRequests {
 public:
  InFlightRequests(ServerMetrics& metrics, const ServerLog& log) : metrics_(metrics), log_(log) {}

  void set_engine(Engine* engine) { engine_ = engine; }  // once loaded: where a gone client's sequences are cancelled

  // A request whose connection will read it (a GenerationSource): active until source_closed.
  void track(const std::shared_ptr<Exchange>& ex);
  // The engine's sink of sequence `index` of `ex`: events queued on the exchange, its connection woken.
  EventSink sink_for(const std::shared_ptr<Exchange>& ex, size_t index);
  // Logged and counted here; the connection answers it (GenerationSource) or, when thrown on the I/O thread, the
  // handler.
  void refuse(Exchange& ex, const ApiError& error);
  // The client went away (a write failed): unfinished sequences are aborted and the engine frees their slots.
  void client_gone(Exchange& ex);
  // Its connection is done with `ex` (`answered`: the whole response was sent): the request is logged.
  void source_closed(Exchange& ex, bool answered);

  // Past the drain grace every request still in flight is answered as aborted.
  void abandon_all();
  bool abandoning() const { return abandon_.load(); }
  // Whatever the engine has not finished is answered as aborted. Called with ex.mutex held.
  void abandon_unfinished(Exchange& ex);
  int active() const { return active_.load(); }  // generation requests in flight

 private:
  void finish_sequence(Exchange& ex, size_t index, const std::string& reason, ServerClock::time_point now);
  void log_request(Exchange& ex);

  ServerMetrics& metrics_;
  const ServerLog& log_;
  Engine* engine_ = nullptr;
  std::atomic<bool> abandon_{false};  // after the drain grace: waiters stop waiting for the engine
  std::atomic<int> active_{0};
  std::mutex exchanges_mutex_;
  std::vector<std::weak_ptr<Exchange>> exchanges_;  // those in flight, for abandon_all
};

}  // namespace qs
