#pragma once
// Where `serve` prepares generation requests: parsing the JSON body, chat templating, tokenizing and decoding media
// (base64, image codecs and resizing, audio resampling, log-mel features) run here, on a few worker threads, so the
// HTTP I/O thread never does that work and the engine thread gets requests ready to admit. Jobs start in the order
// they were posted; the queue is bounded, so a flood is refused at once (HTTP 429) rather than queued without end.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qs {

class PrepareQueue {
 public:
  PrepareQueue(unsigned threads, size_t max_pending);
  ~PrepareQueue();  // runs every job already posted, then joins the workers
  PrepareQueue(const PrepareQueue&) = delete;
  PrepareQueue& operator=(const PrepareQueue&) = delete;

  // False (the job is dropped) when max_pending jobs are waiting or running.
  bool post(std::function<void()> job);

 private:
  void work();

  const size_t max_pending_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace qs
