#pragma once
// A test's view of one engine request: its events collected (token ids, text, finish reason and error) and a wait
// for the last one.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace qs::test {

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text, reason, error;
  bool done = false;

  // `after`, when given, runs after each event is recorded, outside the lock (e.g. a gate that holds the engine).
  EventSink sink(std::function<void()> after = {}) {
    return [this, after = std::move(after)](EngineEvent&& e) {
      {
        std::lock_guard lock(mu);
        for (const auto& t : e.tokens) tokens.push_back(t.id);
        text += e.text;
        if (e.finished) done = true, reason = e.finish_reason, error = e.error, cv.notify_all();
      }
      if (after) after();
      return true;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

}  // namespace qs::test
