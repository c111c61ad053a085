#pragma once
// A persistent pool of worker threads: one per core by default. parallel_for splits [0, n) into contiguous
// chunks so that every core streams its own part of memory.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qs {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads = 0);  // 0 = hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), at least min_chunk items each; the calling
  // thread takes part. The first exception thrown by any chunk is rethrown here after all chunks finish.
  // Safe to call from several threads (calls run one after another) and from inside a job (runs inline).
  void parallel_for(size_t n, size_t min_chunk, const std::function<void(size_t, size_t)>& fn);

  static ThreadPool& shared();
  // Sizes the shared pool (`--threads`): call before its first use; 0 = one thread per core. Throws when the
  // pool already exists with another size, since work already split one way cannot be re-split.
  static void set_shared_threads(unsigned threads);

 private:
  void worker_loop(unsigned index);

  std::vector<std::thread> workers_;
  std::mutex callers_;  // serialises parallel_for calls from different threads
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunks_ = 0, next_chunk_ = 0, finished_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read without it by spinning workers
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};

  void run_chunks(std::unique_lock<std::mutex>& lock);
};

}  // namespace qs
