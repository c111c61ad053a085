#include "util/interrupt.h"

#include <pthread.h>

#include <atomic>
#include <csignal>

#include "util/error.h"

namespace qs {
namespace {
std::atomic<int> g_signal{0};
pthread_t g_main_thread;

// The kernel delivers a process-directed signal to any thread that does not block it. A main thread blocked in a
// system call (opening a named pipe, reading a slow disk) only wakes with EINTR when the signal reaches it, so a
// signal that lands elsewhere is passed on to it (pthread_kill is async-signal-safe).
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  if (!pthread_equal(pthread_self(), g_main_thread)) pthread_kill(g_main_thread, sig);
}
}  // namespace

void install_interrupt_handlers() {
  g_main_thread = pthread_self();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);  // no SA_RESTART: a blocking call returns EINTR and the caller sees interrupted()
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_signal.load() != 0; }

void throw_if_interrupted() {
  if (int sig = g_signal.load()) throw Error(sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
}

}  // namespace qs
