#pragma once
/// MELFORGE_SKIP: a Catch2 v2 test case that cannot run here (no CUDA device, a missing tool) reports itself as
/// *skipped* in CTest instead of passed. Catch2 v2 has no SKIP; this is the project's replacement, for every test
/// executable of the builder (tests/) and of the trainer (trainer/tests/).
///
/// How it works:
/// - `MELFORGE_SKIP(reason)` records the reason for the running test case and **returns from the function it is
///   written in** at once, so nothing after it runs. Write it in the TEST_CASE body itself (a SECTION is fine),
///   not in a helper function or a lambda, where it would only return from those.
/// - A Catch listener in the shared test mains (tests/catch_skip_listener.cpp) prints, when the run ends, one line
///   `MELFORGE-SKIPPED: <test case>: <reason>` per skipped test case, **only if nothing in the run failed**. When
///   an assertion failed (before the skip, or in another run of the same case through GENERATE or SECTIONs), it
///   prints a note without the marker instead, so the test is reported as failed: a test never both skips and
///   hides a failure.
/// - Every discovered CTest entry carries `SKIP_REGULAR_EXPRESSION` set to the marker (`MELFORGE_TEST_SKIP_MARKER`
///   in the top-level CMakeLists.txt), so CTest reports an entry whose output holds the marker as "Skipped" (Not
///   Run). catch_discover_tests makes one CTest entry per TEST_CASE, so the skip is per test case; a GENERATE'd or
///   sectioned case is one entry, and a skip in any of its runs skips the whole entry (put the skip before the
///   GENERATE to make that explicit).
/// - Never print the marker text yourself (a test that echoes a child's output must mask it): CTest's skip
///   expression wins over a non-zero exit code.
///
/// Example:
///   if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
///   if (!have_tool) MELFORGE_SKIP("espeak-ng is not installed (tools/setup.sh installs it), " << detail);
#include <sstream>
#include <string>

namespace melforge::test {

/// Records that the running test case skips, for `reason` (one line). Called by MELFORGE_SKIP; the marker line
/// is printed when the run ends, only if nothing failed.
void note_skip(const std::string& reason);

}  // namespace melforge::test

/// Skips the running test case: records `reason` (anything `std::ostream <<` accepts, chained with `<<`) and
/// returns from the enclosing function (the TEST_CASE body). See the file comment.
#define MELFORGE_SKIP(reason)                                  \
  do {                                                         \
    std::ostringstream melforge_skip_reason_;                  \
    melforge_skip_reason_ << reason;                           \
    ::melforge::test::note_skip(melforge_skip_reason_.str());  \
    return;                                                    \
  } while (false)
