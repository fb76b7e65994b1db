#include "stop.h"

#include <algorithm>
#include <atomic>
#include <csignal>

namespace melforge::builder {

namespace {

/// Signal number given to request_stop(), -1 for a request without one, 0 while none was made.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace

void request_stop(int signal) { g_stop_signal.store(signal > 0 ? signal : -1, std::memory_order_relaxed); }

void clear_stop() { g_stop_signal.store(0, std::memory_order_relaxed); }

void check_stop() {
  const int sig = g_stop_signal.load(std::memory_order_relaxed);
  if (sig == 0) return;
  const std::string name = sig == SIGINT    ? "SIGINT"
                           : sig == SIGTERM ? "SIGTERM"
                           : sig > 0        ? "signal " + std::to_string(sig)
                                            : "a stop request";
  throw Interrupted("interrupted by " + name, std::max(sig, 0));
}

}  // namespace melforge::builder
