#pragma once
// A persistent pool of worker threads: one per core by default. parallel_for splits [0, n) into contiguous
// chunks (a few per thread, claimed as threads come free) so that every core streams its own part of memory and a
// thread held up by another one on its core does not hold the job.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>

#include "util/function_ref.h"
#include <mutex>
#include <thread>
#include <vector>

namespace qs {

using ChunkFn = FunctionRef<void(size_t, size_t)>;  // a chunk of work, fn(begin, end)

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
  void parallel_for(size_t n, size_t min_chunk, ChunkFn fn);

  static ThreadPool& shared();
  // Sizes the shared pool (`--threads`): call before its first use; 0 = one thread per core. Throws when the
  // pool already exists with another size, since work already split one way cannot be re-split.
  static void set_shared_threads(unsigned threads);

 private:
  void worker_loop();
  // Claims and runs chunks of the job of `generation` until none is left or a newer job has begun.
  void run_chunks(uint32_t generation);

  std::vector<std::thread> workers_;
  std::mutex callers_;  // serialises parallel_for calls from different threads
  // A job: its chunks are claimed through ticket_ (generation, chunk count, next chunk; see parallel.cc). A
  // worker that read an old generation can never claim a chunk of a newer job.
  std::atomic<const ChunkFn*> job_{nullptr};
  std::atomic<size_t> job_n_{0};
  std::atomic<uint64_t> ticket_{0};
  std::atomic<size_t> finished_chunks_{0};
  // Sleeping: workers wait for a new generation, the caller for the last chunk, when spinning found neither.
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::exception_ptr error_;  // under mutex_
  std::atomic<bool> stop_{false};
};

}  // namespace qs
