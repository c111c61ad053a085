#include "util/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace qs {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

Progress::Progress(std::string what, uint64_t total_bytes, bool enabled)
    : what_(std::move(what)), total_(total_bytes), enabled_(enabled),
      start_(std::chrono::steady_clock::now()), last_print_(start_) {}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::advance(uint64_t bytes) {
  done_ += bytes;
  auto now = std::chrono::steady_clock::now();
  if (now - last_print_ >= std::chrono::seconds(1)) {
    last_print_ = now;
    print(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  print(true);
}

void Progress::print(bool final) {
  if (!enabled_) return;
  double t = elapsed_seconds();
  double rate = t > 0 ? done_ / t : 0;
  std::string line;
  if (final) {
    line = fmt::format("{}: {} in {:.1f} s ({}/s)", what_, format_bytes(done_), t, format_bytes(rate));
  } else {
    double pct = total_ ? 100.0 * done_ / total_ : 100.0;
    double eta = rate > 0 && total_ > done_ ? (total_ - done_) / rate : 0;
    line = fmt::format("{}: {} / {} ({:.1f}%), {}/s, ETA {:.0f} s", what_, format_bytes(done_),
                       format_bytes(total_), pct, format_bytes(rate), eta);
  }
  bool tty = isatty(STDERR_FILENO);
  std::fprintf(stderr, tty ? "\r\033[K%s%s" : "%s%s", line.c_str(), (final || !tty) ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace qs
