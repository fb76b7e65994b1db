#pragma once
/// The one lock of FFTW's planner in the process. FFTW's plan creation and destruction are not thread-safe (its
/// execute functions are), and the mel engine and the augmenter may plan at the same time on different threads, so
/// every fftwf_plan_* and fftwf_destroy_plan call of melforge takes this lock. An inline function: one mutex for the
/// whole program, whichever translation unit asks.
#include <mutex>

namespace melforge {

/// The mutex every FFTW plan creation and destruction takes.
inline std::mutex& fftw_planner_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace melforge
