#pragma once
// This machine's memory read bandwidth, measured the way decode reads weights: every thread of the pool streams
// its own contiguous part of a buffer far larger than the last-level cache (the L3 here is 260 MB, so a smaller
// buffer measures the cache, not memory), read-only, widest vector loads the CPU has.
#include <cstdint>
#include <memory>
#include <string>

namespace qs {

class ThreadPool;

struct BandwidthResult {
  double bytes_per_second = 0;  // best pass
  uint64_t buffer_bytes = 0;
  unsigned threads = 0;
  int passes = 0;
  std::string isa;  // "avx512", "avx2" or "portable": the loads used
};

// A buffer of about `buffer_bytes` in equal step-aligned slices, one per thread of `pool`, each slice first touched by
// the thread that reads it (page faults happen here, not in a timed pass).
class ReadSweep {
 public:
  ReadSweep(ThreadPool& pool, uint64_t buffer_bytes);
  ~ReadSweep();
  double pass();  // bytes/s of one read of the whole buffer by all the threads
  uint64_t bytes() const;
  const char* isa() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Reads `buffer_bytes` `passes` times on every thread of `pool` and keeps the fastest pass (the others lost time
// to the shared host). The buffer is touched once before timing so page faults are not counted.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, uint64_t buffer_bytes, int passes = 3);

}  // namespace qs
