// The listener behind MELFORGE_SKIP (test_skip.h), linked into both shared test mains (catch_main.cpp and
// catch_main_cuda.cpp). It prints the CTest skip marker at the end of a run in which nothing failed.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <iostream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "test_skip.h"

#ifndef MELFORGE_TEST_SKIP_MARKER
#error "MELFORGE_TEST_SKIP_MARKER must be defined (tests/CMakeLists.txt), the text CTest's SKIP_REGULAR_EXPRESSION matches"
#endif

namespace melforge::test {

namespace {

/// The skips of one process: the reasons noted by the running test case, and every finished test case's.
struct SkipLog {
  std::mutex mutex;
  /// Reasons noted since the current test case started.
  std::vector<std::string> pending;
  /// (test case name, reason) of every finished test case that skipped, in order.
  std::vector<std::pair<std::string, std::string>> skipped;
};

SkipLog& skip_log() {
  static SkipLog log;
  return log;
}

/// Collects the skips of each test case and, when the run ends, prints the marker line of each one if no
/// assertion and no test case of the run failed, or a note without the marker otherwise.
class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    std::lock_guard lock(skip_log().mutex);
    skip_log().pending.clear();
  }

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    {
      SkipLog& log = skip_log();
      std::lock_guard lock(log.mutex);
      for (auto& reason : log.pending) log.skipped.emplace_back(stats.testInfo.name, std::move(reason));
      log.pending.clear();
    }
    TestEventListenerBase::testCaseEnded(stats);
  }

  void testRunEnded(const Catch::TestRunStats& stats) override {
    SkipLog& log = skip_log();
    std::lock_guard lock(log.mutex);
    const bool failed = stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0;
    for (const auto& [name, reason] : log.skipped) {
      if (failed)
        std::cout << "melforge: the skip of '" << name << "' (" << reason
                  << ") is not reported as a skip: this run has failures\n";
      else
        std::cout << MELFORGE_TEST_SKIP_MARKER << " " << name << ": " << reason << "\n";
    }
    std::cout.flush();
    TestEventListenerBase::testRunEnded(stats);
  }
};

CATCH_REGISTER_LISTENER(SkipListener)

}  // namespace

void note_skip(const std::string& reason) {
  std::lock_guard lock(skip_log().mutex);
  skip_log().pending.push_back(reason);
}

}  // namespace melforge::test
