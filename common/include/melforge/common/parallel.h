#pragma once
/// Data-parallel loops on a fixed number of threads, with exceptions carried back to the caller.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>

namespace melforge {

/// Number of worker threads to use: `requested` when > 0, else the number of online cores.
inline int resolve_threads(int requested) { return requested > 0 ? requested : std::max(1, omp_get_num_procs()); }

/// Calls `fn(i)` for every i in [0, n) on `threads` threads (dynamic schedule, `grain` iterations at a time).
/// The first exception thrown by any call is rethrown here after all threads stop; later iterations are skipped.
template <class F>
void parallel_for(int64_t n, int threads, F&& fn, int64_t grain = 1) {
  if (n <= 0) return;
  threads = static_cast<int>(std::min<int64_t>(std::max(1, threads), n));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  bool failed = false;
#pragma omp parallel for num_threads(threads) schedule(dynamic, grain)
  for (int64_t i = 0; i < n; ++i) {
    bool skip;
#pragma omp atomic read
    skip = failed;
    if (skip) continue;
    try {
      fn(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
#pragma omp atomic write
      failed = true;
    }
  }
  if (error) std::rethrow_exception(error);
}

/// Calls `fn(thread_index, begin, end)` once per thread over contiguous, nearly equal ranges of [0, n).
/// Use it when each thread needs its own scratch buffers.
template <class F>
void parallel_ranges(int64_t n, int threads, F&& fn) {
  if (n <= 0) return;
  threads = static_cast<int>(std::min<int64_t>(std::max(1, threads), n));
  parallel_for(threads, threads, [&](int64_t t) {
    const int64_t begin = n * t / threads;
    const int64_t end = n * (t + 1) / threads;
    fn(static_cast<int>(t), begin, end);
  });
}

}  // namespace melforge
