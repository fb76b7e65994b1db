// common/parallel.h: every index visited once, the first exception carried back, and the OpenMP workers that the
// builder's decode, mel and compression loops run on do not spin once a loop has ended (issue 5: nothing spins when
// idle).
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "melforge/common/parallel.h"
#include "reliability/child_process.h"

namespace melforge_test_parallel {

using namespace melforge;

namespace {

/// Milliseconds the OpenMP runtime lets an idle worker spin before it sleeps: LLVM's libomp (the clang sanitizer
/// builds) spins for KMP_BLOCKTIME, 200 ms by default; GCC's libgomp (the Release build) for GOMP_SPINCOUNT
/// iterations, well under a millisecond, taken as 0.
int runtime_spin_ms() {
#ifdef KMP_VERSION_MAJOR
  return kmp_get_blocktime();
#else
  return 0;
#endif
}

/// CPU time of the whole process while the calling thread sleeps for `ms` milliseconds.
double cpu_seconds_while_sleeping(int ms) {
  const double before = test::own_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return test::own_cpu_seconds() - before;
}

}  // namespace

TEST_CASE("parallel_for visits every index once and parallel_ranges covers 0 to n in contiguous ranges",
          "[parallel]") {
  const int threads = GENERATE(1, 2, 4);
  const int64_t n = GENERATE(0, 1, 3, 1000);
  CAPTURE(threads, n);
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  parallel_for(n, threads, [&](int64_t i) { hits[static_cast<std::size_t>(i)]++; });
  for (const auto& h : hits) REQUIRE(h.load() == 1);

  std::vector<std::atomic<int>> owner(static_cast<std::size_t>(n));
  for (auto& o : owner) o = -1;
  parallel_ranges(n, threads, [&](int thread, int64_t begin, int64_t end) {
    REQUIRE(begin <= end);
    for (int64_t i = begin; i < end; ++i) owner[static_cast<std::size_t>(i)] = thread;
  });
  for (std::size_t i = 0; i < owner.size(); ++i) {
    REQUIRE(owner[i].load() >= 0);
    if (i > 0) REQUIRE(owner[i].load() >= owner[i - 1].load());
  }
}

TEST_CASE("parallel_for rethrows the first exception after every thread stops", "[parallel]") {
  const int threads = GENERATE(1, 2);
  std::atomic<int> calls{0};
  CHECK_THROWS_WITH(parallel_for(100, threads,
                                 [&](int64_t i) {
                                   ++calls;
                                   if (i == 10) throw std::runtime_error("item 10");
                                 }),
                    "item 10");
  if (threads == 1) CHECK(calls.load() == 11);
}

TEST_CASE("the workers of parallel_for do not spin once a loop has ended", "[parallel][reliability][resources]") {
  std::atomic<double> sink{0.0};
  parallel_for(
      64, 2,
      [&](int64_t i) {
        double v = 0;
        for (int k = 0; k < 200000; ++k) v += std::sqrt(static_cast<double>(k + i));
        sink = sink + v;
      },
      1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50 + runtime_spin_ms()));
  const double idle = cpu_seconds_while_sleeping(300);

  INFO("the measure sees a spinning thread: at least 30 ms of CPU time in 150 ms");
  std::atomic<bool> stop{false};
  std::thread spin([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const double spinning = cpu_seconds_while_sleeping(150);
  stop = true;
  spin.join();
  CHECK(spinning >= 0.03);

  INFO("CPU time of the whole process during 300 ms of idle, " << 50 + runtime_spin_ms()
                                                                 << " ms after a loop on 2 threads: " << idle << " s");
  CHECK(idle >= 0.0);
  CHECK(idle < 0.03);
  CHECK(sink.load() > 0.0);
}

TEST_CASE("resolve_threads caps a thread count at 4 per core, and says so", "[parallel][resources]") {
  const int cores = std::max(1, omp_get_num_procs());
  CHECK(max_threads() == 4 * cores);
  CHECK(resolve_threads(0) == cores);
  CHECK(resolve_threads(1) == 1);
  CHECK(resolve_threads(4 * cores) == 4 * cores);
  CHECK(resolve_threads(4 * cores + 1) == 4 * cores);
  CHECK(resolve_threads(10000) == std::min(10000, 4 * cores));
  CHECK(threads_cap_warning(4 * cores).empty());
  const std::string warning = threads_cap_warning(4 * cores + 1);
  CHECK(warning == "--threads " + std::to_string(4 * cores + 1) + " is more than 4 threads per core (" +
                       std::to_string(cores) + " cores); using " + std::to_string(4 * cores));
  CHECK(warning.find('\n') == std::string::npos);
}

}  // namespace melforge_test_parallel
