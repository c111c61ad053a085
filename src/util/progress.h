#pragma once
// Progress of long work (repack, verify, synth, load) on stderr: bytes done, rate and ETA, at most a line a
// second, so a user can tell a slow run from a hung one.
#include <chrono>
#include <cstdint>
#include <string>

namespace qs {

class Progress {
 public:
  Progress(std::string what, uint64_t total_bytes, bool enabled = true);
  void advance(uint64_t bytes);  // thread-compatible: call from one thread
  void finish();
  double elapsed_seconds() const;

 private:
  void print(bool final);
  std::string what_;
  uint64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

std::string format_bytes(double bytes);

}  // namespace qs
