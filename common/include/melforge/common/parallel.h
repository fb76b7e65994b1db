#pragma once
/// Data-parallel loops on a fixed number of threads, with exceptions carried back to the caller.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

namespace melforge {

/// Threads per online core that a --threads value may ask for. Decode waits on the disk, so a few threads per core
/// can help on slow storage; beyond that a thread only costs memory (its stack, the per-thread buffers that --max-ram
/// reserves) and, through the OpenMP and LibTorch pools, many more threads than asked: --threads 10000 made 20,000
/// threads (5.4 GB) in melforge-train and 420 MB in melforge-build (issue 15).
inline constexpr int kMaxThreadsPerCore = 4;

/// The most threads a worker pool of melforge runs: kMaxThreadsPerCore x the online cores (omp_get_num_procs, which
/// follows the process's CPU affinity).
inline int max_threads() { return kMaxThreadsPerCore * std::max(1, omp_get_num_procs()); }

/// Number of worker threads to use: `requested` when > 0, else the number of online cores; at most max_threads().
inline int resolve_threads(int requested) {
  return requested > 0 ? std::min(requested, max_threads()) : std::max(1, omp_get_num_procs());
}

/// The one-line warning for a `flag` value (e.g. "--threads") that resolve_threads caps: "--threads 10000 is more
/// than 4 threads per core (2 cores); using 8"; empty when `requested` <= max_threads().
inline std::string threads_cap_warning(int requested, const std::string& flag = "--threads") {
  if (requested <= max_threads()) return {};
  return flag + " " + std::to_string(requested) + " is more than " + std::to_string(kMaxThreadsPerCore) +
         " threads per core (" + std::to_string(std::max(1, omp_get_num_procs())) + " cores); using " +
         std::to_string(max_threads());
}

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
