// MELFORGE_SKIP (test_skip.h): the hidden fixture cases below skip, pass or fail in every combination; the visible
// cases run them in child processes of this very executable, directly and through a real CTest with the
// SKIP_REGULAR_EXPRESSION that CMake gives every discovered test, and check what CTest reports.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "reliability/child_process.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_skip_marker {

namespace fs = std::filesystem;
using melforge::test::TempDir;

// Hidden ([.]) fixtures: not discovered by CTest, run only by name from the cases further down.

TEST_CASE("skip fixture: skips", "[.skipfixture]") { MELFORGE_SKIP("no widget " << 42 << " here"); }

TEST_CASE("skip fixture: passes", "[.skipfixture]") { CHECK(std::string("a") + "b" == "ab"); }

TEST_CASE("skip fixture: fails before the skip", "[.skipfixture]") {
  CHECK(std::string("a") == "b");
  MELFORGE_SKIP("after a failure");
}

TEST_CASE("skip fixture: nothing after the skip runs", "[.skipfixture]") {
  MELFORGE_SKIP("early");
  FAIL("this statement ran after MELFORGE_SKIP");
}

TEST_CASE("skip fixture: one generated value skips and the other fails", "[.skipfixture]") {
  const int v = GENERATE(0, 1);
  if (v == 0) MELFORGE_SKIP("value 0");
  CHECK(v == 0);
}

TEST_CASE("skip fixture: one generated value skips and the other passes", "[.skipfixture]") {
  const int v = GENERATE(0, 1);
  if (v == 1) MELFORGE_SKIP("value 1");
  CHECK(v == 0);
}

TEST_CASE("skip fixture: the second section skips", "[.skipfixture]") {
  SECTION("first") { CHECK(true); }
  SECTION("second") { MELFORGE_SKIP("in the second section"); }
}

namespace {

const std::string kMarker = MELFORGE_TEST_SKIP_MARKER;

/// `text` with the marker masked, so that a failing case here that shows a child's output is not itself taken for
/// a skip by CTest.
std::string masked(std::string text) {
  for (std::size_t at = text.find(kMarker); at != std::string::npos; at = text.find(kMarker, at))
    text.replace(at, kMarker.size(), "<skip marker>");
  return text;
}

/// This test executable.
std::string self() { return fs::read_symlink("/proc/self/exe").string(); }

/// The fixture `name` run alone in a child, as catch_discover_tests's CTest entry runs it.
melforge::test::ChildResult run_fixture(const std::string& name, const fs::path& log) {
  return melforge::test::run_child({self(), name}, log);
}

/// What CTest said about each test of a CTestTestfile.cmake: "Passed", "Skipped" or "Failed", by test name.
std::map<std::string, std::string> ctest_verdicts(const std::string& output) {
  std::map<std::string, std::string> verdicts;
  const std::regex line(R"(Test +#\d+: (.+?) \.+\s*(\*\*\*)?(Passed|Skipped|Failed))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    verdicts[(*it)[1].str()] = (*it)[3].str();
  return verdicts;
}

/// `name` as catch_discover_tests passes it to Catch (',' '[' ']' escaped).
std::string catch_spec(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == ',' || c == '[' || c == ']') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

TEST_CASE("MELFORGE_SKIP returns at once and prints the marker only when nothing failed", "[test_skip]") {
  TempDir d;
  const auto skips = run_fixture("skip fixture: skips", d / "skips.log");
  INFO(masked(skips.output));
  CHECK(skips.exit_code == 0);
  CHECK(skips.output.find(kMarker + " skip fixture: skips: no widget 42 here\n") != std::string::npos);

  const auto passes = run_fixture("skip fixture: passes", d / "passes.log");
  CHECK(passes.exit_code == 0);
  CHECK(passes.output.find(kMarker) == std::string::npos);

  const auto early = run_fixture("skip fixture: nothing after the skip runs", d / "early.log");
  CHECK(early.exit_code == 0);
  CHECK(early.output.find("ran after MELFORGE_SKIP") == std::string::npos);
  CHECK(early.output.find(kMarker) != std::string::npos);

  for (const char* failing : {"skip fixture: fails before the skip",
                              "skip fixture: one generated value skips and the other fails"}) {
    const auto r = run_fixture(failing, d / "failing.log");
    INFO(failing << "\n" << masked(r.output));
    CHECK(r.exit_code != 0);
    CHECK(r.output.find(kMarker) == std::string::npos);
    CHECK(r.output.find("is not reported as a skip: this run has failures") != std::string::npos);
  }

  // Several cases in one process (not how CTest runs them): one failure anywhere withholds every marker.
  const auto both = melforge::test::run_child({self(), "[.skipfixture]"}, d / "all.log");
  INFO(masked(both.output));
  CHECK(both.exit_code != 0);
  CHECK(both.output.find(kMarker) == std::string::npos);
}

TEST_CASE("CTest reports a MELFORGE_SKIP as skipped per test case and never hides a failure", "[test_skip]") {
  const std::map<std::string, std::string> expected = {
      {"skip fixture: skips", "Skipped"},
      {"skip fixture: passes", "Passed"},
      {"skip fixture: fails before the skip", "Failed"},
      {"skip fixture: nothing after the skip runs", "Skipped"},
      {"skip fixture: one generated value skips and the other fails", "Failed"},
      {"skip fixture: one generated value skips and the other passes", "Skipped"},
      {"skip fixture: the second section skips", "Skipped"}};
  TempDir d;
  {
    std::ofstream f(d / "CTestTestfile.cmake");
    for (const auto& [name, verdict] : expected) {
      f << "add_test([==[" << name << "]==] [==[" << self() << "]==] [==[" << catch_spec(name) << "]==])\n";
      f << "set_tests_properties([==[" << name << "]==] PROPERTIES SKIP_REGULAR_EXPRESSION [==[" << kMarker
        << "]==])\n";
    }
  }
  const auto r = melforge::test::run_child({MELFORGE_CTEST_COMMAND, "--test-dir", d.path().string()},
                                           d / "ctest.log");
  INFO(masked(r.output));
  CHECK(r.exit_code != 0);
  const auto verdicts = ctest_verdicts(r.output);
  for (const auto& [name, verdict] : expected) {
    INFO(name);
    REQUIRE(verdicts.count(name) == 1);
    CHECK(verdicts.at(name) == verdict);
  }
  CHECK(r.output.find("tests passed, 2 tests failed out of 7") != std::string::npos);
  CHECK(r.output.find("The following tests did not run:") != std::string::npos);
}

}  // namespace melforge_test_skip_marker
