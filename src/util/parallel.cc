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
// Chunks per thread: a job is over-split so that when one thread is held up (the HTTP thread, or another process,
// took its core) the others claim its share instead of idling until it comes back. With one chunk per thread a
// 50 us interruption of either thread delays the whole job by 50 us.
constexpr size_t kChunksPerThread = 4;
}

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_ = true;
  { std::lock_guard lock(mutex_); }
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

namespace {
// ticket_: generation in bits 63-32, the job's chunk count in 31-16, the next unclaimed chunk in 15-0. The count
// travels with the generation, so a claim never compares against a newer job's count.
uint32_t generation_of(uint64_t ticket) { return static_cast<uint32_t>(ticket >> 32); }
size_t chunks_of(uint64_t ticket) { return (ticket >> 16) & 0xffffu; }
size_t next_of(uint64_t ticket) { return ticket & 0xffffu; }
}  // namespace

void ThreadPool::run_chunks(uint32_t generation) {
  // Read after this generation was seen and before a chunk of it is claimed: the job cannot end, and its fields
  // cannot be replaced, while the chunk a successful claim takes is unfinished.
  const auto* fn = job_.load(std::memory_order_relaxed);
  const size_t n = job_n_.load(std::memory_order_relaxed);
  uint64_t ticket = ticket_.load(std::memory_order_acquire);
  while (generation_of(ticket) == generation && next_of(ticket) < chunks_of(ticket)) {
    if (!ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel)) continue;
    const size_t chunks = chunks_of(ticket), chunk = next_of(ticket);
    const size_t begin = n * chunk / chunks, end = n * (chunk + 1) / chunks;
    t_inside_pool_job = true;
    try {
      (*fn)(begin, end);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    t_inside_pool_job = false;
    if (finished_chunks_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      { std::lock_guard lock(mutex_); }  // a caller about to sleep has either seen the count or is waiting
      done_.notify_one();
    }
    ticket = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  while (true) {
    // A decode step issues hundreds of jobs of tens of microseconds back to back; waking a sleeping thread costs
    // about as much as such a job, so a worker first spins briefly for the next one.
    auto fresh = [&] { return stop_.load(std::memory_order_acquire) || generation_of(ticket_.load(std::memory_order_acquire)) != seen; };
    for (int i = 0; i < kSpins && !fresh(); ++i) __builtin_ia32_pause();
    if (!fresh()) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, fresh);
    }
    if (stop_) return;
    seen = generation_of(ticket_.load(std::memory_order_acquire));
    run_chunks(seen);
  }
}

void ThreadPool::parallel_for(size_t n, size_t min_chunk, ChunkFn fn) {
  if (n == 0) return;
  size_t chunks = std::min<size_t>({size() * kChunksPerThread, 0xffffu, std::max<size_t>(1, n / std::max<size_t>(1, min_chunk))});
  if (chunks <= 1 || size() == 1 || t_inside_pool_job) {
    fn(0, n);
    return;
  }
  // One job at a time: callers on other threads (the engine, a test, a tool) queue here.
  std::lock_guard caller(callers_);
  job_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  finished_chunks_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_of(ticket_.load(std::memory_order_relaxed)) + 1;
  ticket_.store(uint64_t(generation) << 32 | uint64_t(chunks) << 16, std::memory_order_release);
  { std::lock_guard lock(mutex_); }  // a worker about to sleep has either seen the new generation or is waiting
  wake_.notify_all();
  run_chunks(generation);
  auto finished = [&] { return finished_chunks_.load(std::memory_order_acquire) == chunks; };
  for (int i = 0; i < kSpins && !finished(); ++i) __builtin_ia32_pause();
  std::unique_lock lock(mutex_);
  done_.wait(lock, finished);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace qs
