#include "server/prepare_queue.h"

namespace qs {

PrepareQueue::PrepareQueue(unsigned threads, size_t max_pending) : max_pending_(max_pending) {
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

PrepareQueue::~PrepareQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool PrepareQueue::post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || jobs_.size() + running_ >= max_pending_) return false;
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
  return true;
}

void PrepareQueue::work() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    job();  // jobs catch their own errors
    lock.lock();
    --running_;
  }
}

}  // namespace qs
