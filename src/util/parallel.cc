#include "util/parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "util/error.h"

namespace qs {
namespace {
thread_local bool t_inside_pool_job = false;  // a job that calls parallel_for again runs the inner loop inline
constexpr int kSpins = 4000;                  // pause instructions: about 0.1-0.3 ms
}

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
std::atomic<unsigned> g_shared_threads{0};
std::atomic<bool> g_shared_made{false};
}  // namespace

ThreadPool& ThreadPool::shared() {
  static ThreadPool pool((g_shared_made = true, g_shared_threads.load()));
  return pool;
}

void ThreadPool::set_shared_threads(unsigned threads) {
  if (g_shared_made) {
    if (threads != 0 && threads != shared().size())
      throw Error(fmt::format("threads: the shared pool already runs {} threads, cannot change to {}", shared().size(), threads));
    return;
  }
  g_shared_threads = threads;
}

void ThreadPool::run_chunks(std::unique_lock<std::mutex>& lock) {
  while (job_ && next_chunk_ < job_chunks_) {
    size_t chunk = next_chunk_++;
    size_t begin = job_n_ * chunk / job_chunks_, end = job_n_ * (chunk + 1) / job_chunks_;
    const auto* fn = job_;
    lock.unlock();
    std::exception_ptr err;
    t_inside_pool_job = true;
    try {
      (*fn)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
    t_inside_pool_job = false;
    lock.lock();
    if (err && !error_) error_ = err;
    if (++finished_chunks_ == job_chunks_) done_.notify_all();
  }
}

void ThreadPool::worker_loop(unsigned) {
  std::unique_lock lock(mutex_);
  uint64_t seen = 0;
  while (true) {
    // A decode step issues hundreds of jobs of tens of microseconds back to back; waking a sleeping thread costs
    // about as much as such a job, so a worker first spins briefly for the next one.
    lock.unlock();
    for (int i = 0; i < kSpins && !stop_ && generation_.load(std::memory_order_acquire) == seen; ++i)
      __builtin_ia32_pause();
    lock.lock();
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    run_chunks(lock);
  }
}

void ThreadPool::parallel_for(size_t n, size_t min_chunk, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  size_t chunks = std::min<size_t>(size(), std::max<size_t>(1, n / std::max<size_t>(1, min_chunk)));
  if (chunks <= 1 || t_inside_pool_job) {
    fn(0, n);
    return;
  }
  // One job at a time: callers on other threads (the engine, a test, a tool) queue here.
  std::lock_guard caller(callers_);
  std::unique_lock lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  next_chunk_ = finished_chunks_ = 0;
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  run_chunks(lock);
  done_.wait(lock, [&] { return finished_chunks_ == job_chunks_; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace qs
