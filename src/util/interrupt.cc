#include "util/interrupt.h"

#include <csignal>
#include <atomic>

#include "util/error.h"

namespace qs {
namespace {
std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal.store(sig); }
}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_signal.load() != 0; }

void throw_if_interrupted() {
  if (int sig = g_signal.load()) throw Error(sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
}

}  // namespace qs
