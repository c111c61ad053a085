#include "server/in_flight_requests.h"

#include <fmt/format.h>

#include <optional>

namespace qs {

using ojson = nlohmann::ordered_json;

void InFlightRequests::track(const std::shared_ptr<Exchange>& ex) {
  ++active_;
  std::lock_guard lock(exchanges_mutex_);
  std::erase_if(exchanges_, [](const std::weak_ptr<Exchange>& e) { return e.expired(); });
  exchanges_.push_back(ex);
}

void InFlightRequests::source_closed(Exchange& ex, bool answered) {
  if (!answered) client_gone(ex);
  log_request(ex);
  --active_;
}

// Called with ex.mutex held.
void InFlightRequests::finish_sequence(Exchange& ex, size_t index, const std::string& reason,
                                       ServerClock::time_point now) {
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

EventSink InFlightRequests::sink_for(const std::shared_ptr<Exchange>& ex, size_t index) {
  return [this, ex, index](EngineEvent&& event) -> bool {
    const auto now = ServerClock::now();
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
    if (ex->wake) ex->wake();
    return true;
  };
}

void InFlightRequests::client_gone(Exchange& ex) {
  std::vector<uint64_t> cancel;
  {
    std::lock_guard lock(ex.mutex);
    if (ex.client_gone) return;
    ex.client_gone = true;
    const auto now = ServerClock::now();
    for (size_t i = 0; i < ex.sequences.size(); ++i) {
      if (ex.sequences[i].finished) continue;
      if (ex.sequences[i].submitted) cancel.push_back(ex.sequences[i].engine_id);
      finish_sequence(ex, i, "abort", now);
    }
  }
  for (uint64_t id : cancel) engine_->cancel(id);
}

void InFlightRequests::abandon_unfinished(Exchange& ex) {
  const auto now = ServerClock::now();
  for (size_t i = 0; i < ex.sequences.size(); ++i) {
    if (ex.sequences[i].finished) continue;
    finish_sequence(ex, i, "abort", now);
    EngineEvent e;
    e.finished = true;
    e.finish_reason = "abort";
    ex.events.emplace_back(i, std::move(e));
  }
}

void InFlightRequests::log_request(Exchange& ex) {
  std::lock_guard lock(ex.mutex);
  if (ex.discarded) return;  // refused: logged as such
  std::optional<ServerClock::time_point> first;
  ServerClock::time_point end = ex.arrival;
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
  const ojson x_request_id = ex.client_request_id.empty() ? ojson(nullptr) : ojson(ex.client_request_id);
  ojson fields = {{"id", ex.id}, {"x_request_id", x_request_id}, {"path", ex.path}, {"n", ex.sequences.size()},
                  {"prompt_tokens", ex.prompt_tokens},
                  {"completion_tokens", generated}, {"ttft_s", ttft ? ojson(*ttft) : ojson(nullptr)},
                  {"tokens_per_s", tokens_per_s}, {"latency_s", latency}, {"outcome", reasons},
                  {"client_gone", ex.client_gone}};
  log_.write("request",
             fmt::format("{}{} {} n={} prompt={} completion={} ttft={} {:.1f} tok/s {:.3f} s outcome={}", ex.id,
                         ex.client_request_id.empty() ? "" : " x-request-id=" + ex.client_request_id, ex.path,
                         ex.sequences.size(), ex.prompt_tokens, generated,
                         ttft ? fmt::format("{:.3f} s", *ttft) : std::string("-"), tokens_per_s, latency, outcome),
             std::move(fields));
}

void InFlightRequests::refuse(Exchange& ex, const ApiError& error) {
  metrics_.request_rejected();
  log_.write("rejected", fmt::format("{} {} rejected {}: {}", ex.id, ex.path, error.status(), error.what()),
             {{"id", ex.id}, {"path", ex.path}, {"status", error.status()}, {"error", error.what()}}, "warning");
  std::lock_guard lock(ex.mutex);
  ex.discarded = true;
  ex.refusal = error;
  if (ex.wake) ex.wake();
}

void InFlightRequests::abandon_all() {
  abandon_ = true;
  std::lock_guard lock(exchanges_mutex_);
  for (const auto& weak : exchanges_) {
    if (auto ex = weak.lock()) {
      std::lock_guard ex_lock(ex->mutex);
      if (ex->wake) ex->wake();
    }
  }
}

}  // namespace qs
