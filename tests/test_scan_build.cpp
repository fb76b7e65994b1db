// melforge-build end to end on corpora the scan must not lose silently (issue 15): hidden entries, unreadable
// folders, the output folder inside the input, pre-split layouts with other folders, duplicate manifest lines,
// labels differing in case, and splits that would be empty.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <set>

#include "reliability/child_process.h"
#include "reliability/corpus.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_scan_build {

using namespace melforge;
using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;

namespace {

constexpr uid_t kNobody = 65534;

/// Runs melforge-build on `in` into `out` (build_args, --split 0.5,0.25,0.25, plus `extra`) as `opts` says; the
/// output goes to build.log beside `in`.
test::ChildResult build(const fs::path& in, const fs::path& out, std::vector<std::string> extra = {},
                        const test::ChildOptions& opts = {}) {
  extra.insert(extra.end(), {"--split", "0.5,0.25,0.25"});
  return test::run_child(test::build_args(in, out, extra), in.parent_path() / "build.log", opts);
}

nlohmann::json report(const fs::path& out) {
  return nlohmann::json::parse(test::read_file_bytes(out / "build_report.json"));
}

/// Two classes of four 1.5 s tones at 8 kHz.
void write_corpus(const fs::path& in) {
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 4; ++i)
      test::write_tone(in / ("c" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"), 300 + 200 * c + 10 * i,
                       12000, 8000);
}

/// True when nothing of a build's outputs is in `out`.
bool nothing_installed(const fs::path& out) {
  for (const auto& name : test::kOutputNames)
    if (fs::exists(out / name)) return false;
  return true;
}

}  // namespace

TEST_CASE("hidden entries are ignored and counted, not skipped, and --include-hidden scans them", "[scan][hidden][e2e]") {
  TempDir d;
  write_corpus(d / "in");
  write_text(d / "in/c0/.DS_Store", "Bud1");
  write_text(d / "in/c1/._f0.wav", "AppleDouble");
  write_text(d / "in/.Trash-1000/files/x.wav", "junk");
  const auto r = build(d / "in", d / "out", {"--strict"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto rep = report(d / "out");
  CHECK(rep["hidden"]["count"] == 3);
  CHECK(rep["files"]["hidden"] == 3);
  CHECK(rep["hidden"]["paths"] == nlohmann::json{".Trash-1000", "c0/.DS_Store", "c1/._f0.wav"});
  CHECK(rep["files"]["scanned"] == 8);
  CHECK(rep["skipped"].empty());

  const auto all = build(d / "in", d / "out", {"--strict", "--overwrite", "--include-hidden"});
  CHECK(all.exit_code == 3);
  CHECK_THAT(all.output, Catch::Contains("--strict: .Trash-1000/files/x.wav: not inside a class folder") ||
                             Catch::Contains("--strict: c0/.DS_Store: not an audio file extension"));
}

TEST_CASE("a folder the build cannot read is skipped with its reason, and fatal under --strict",
          "[scan][permissions][e2e]") {
  TempDir d;
  fs::permissions(d.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  write_corpus(d / "in");
  test::write_tone(d / "in/c2/f.wav", 900, 12000, 8000);
  fs::permissions(d / "in/c2", fs::perms::none);
  test::ChildOptions as;
  if (::geteuid() == 0) {
    as.uid = kNobody;
    for (const char* o : {"out", "strict"}) {
      fs::create_directories(d / o);
      REQUIRE(::chown((d / o).c_str(), kNobody, kNobody) == 0);
    }
  }
  const auto r = build(d / "in", d / "out", {"--overwrite"}, as);
  const auto strict = build(d / "in", d / "strict", {"--overwrite", "--strict"}, as);
  fs::permissions(d / "in/c2", fs::perms::owner_all);
  if (r.exit_code == 121)
    MELFORGE_SKIP("running as root, whose reads bypass chmod 000, and a child cannot switch to uid 65534");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto rep = report(d / "out");
  REQUIRE(rep["skipped"].size() == 1);
  CHECK(rep["skipped"][0]["path"] == "c2");
  CHECK(rep["skipped"][0]["reason"] == "cannot read folder: Permission denied");
  CHECK(strict.exit_code == 3);
  CHECK_THAT(strict.output, Catch::Contains("--strict: c2: cannot read folder: Permission denied"));
  CHECK(nothing_installed(d / "strict"));
}

TEST_CASE("an output folder inside the input folder is left out of the scan", "[scan][exclude][e2e]") {
  TempDir d;
  write_corpus(d / "in");
  const fs::path out = d / "in/out";
  const auto first = build(d / "in", out, {"--strict"});
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto second = build(d / "in", out, {"--strict", "--overwrite"});
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, Catch::Contains("output folder") && Catch::Contains("not scanned"));
  const auto rep = report(out);
  CHECK(rep["files"]["scanned"] == 8);
  CHECK(rep["classes"] == nlohmann::json{"c0", "c1"});
  REQUIRE(rep["excluded"].size() == 1);
  CHECK(rep["excluded"][0]["path"] == "out");

  const auto same = build(d / "in", d / "in", {"--overwrite"});
  CHECK(same.exit_code == 2);
  CHECK_THAT(same.output, Catch::Contains("is the --input folder"));
}

TEST_CASE("a split that would be empty fails the build before anything is installed", "[scan][empty][e2e]") {
  TempDir d;
  write_corpus(d / "in");
  SECTION("--channel 5 on mono files") {
    const auto r = build(d / "in", d / "out", {"--channel", "5"});
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("train would be empty: all 4 files were skipped (4 'channel 5 requested "
                                         "but the file has 1 channel')"));
  }
  SECTION("every file is unreadable audio") {
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 4; ++i)
        write_text(d / "in" / ("c" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"), "not audio");
    const auto r = build(d / "in", d / "out");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("train would be empty: all 4 files were skipped (4 '"));
  }
  SECTION("every file is hidden") {
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 4; ++i) {
        const fs::path f = d / "in" / ("c" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav");
        fs::rename(f, f.parent_path() / ("." + f.filename().string()));
      }
    const auto r = build(d / "in", d / "out");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("train would be empty: no audio file found") &&
                             Catch::Contains("8 hidden entries ignored"));
  }
  SECTION("the val files all fail to decode (NaN samples): found after the batches") {
    fs::rename(d / "in", d / "train");
    fs::create_directories(d / "in");
    fs::rename(d / "train", d / "in/train");
    test::write_tone(d / "in/val/c0/nan.wav", 440, 12000, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 100);
    const auto r = build(d / "in", d / "out");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("val would be empty: all 1 file was skipped (1 '") &&
                             Catch::Contains("NaN sample at frame 100"));
  }
  INFO(test::read_file_bytes(d / "build.log"));
  CHECK(nothing_installed(d / "out"));
}

TEST_CASE("classes without a training file and labels differing in case are reported", "[scan][warnings][e2e]") {
  TempDir d;
  write_corpus(d / "in");
  for (int i = 0; i < 4; ++i) test::write_tone(d / "in/C0" / ("g" + std::to_string(i) + ".wav"), 700, 12000, 8000);
  test::write_text(d / "in/rare/broken.wav", "not audio");
  const auto r = build(d / "in", d / "out");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("warning: labels 'C0', 'c0' differ only in case"));
  CHECK_THAT(r.output, Catch::Contains("warning: class 'rare' has no training file (1 skipped)"));
  CHECK_THAT(r.output, Catch::Contains("warning: 1 class has a single file, which cannot be in both train and test: "
                                       "'rare'"));
  const auto warnings = report(d / "out")["warnings"].get<std::vector<std::string>>();
  CHECK(warnings.size() == 3);
}

TEST_CASE("a pre-split layout with another top-level folder fails before any work, naming it", "[scan][presplit][e2e]") {
  TempDir d;
  write_corpus(d / "in/train");
  write_corpus(d / "in/validation");
  write_corpus(d / "in/extra");
  write_text(d / "in/.ipynb_checkpoints/x.txt", "x");
  const auto r = build(d / "in", d / "out");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("other folders ('extra')"));
  CHECK(nothing_installed(d / "out"));
  fs::remove_all(d / "in/extra");
  const auto ok = build(d / "in", d / "out");
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  const auto rep = report(d / "out");
  CHECK(rep["files"]["per_split"]["train"] == 8);
  CHECK(rep["files"]["per_split"]["val"] == 8);
  CHECK(rep["hidden"]["paths"] == nlohmann::json{".ipynb_checkpoints"});
}

TEST_CASE("a manifest listing one file twice under two spellings is refused", "[scan][csv][e2e]") {
  TempDir d;
  write_corpus(d / "in");
  write_text(d / "m.csv", "path,label\nin/c0/f0.wav,a\nin/c0/f1.wav,a\nin/c1/f0.wav,b\n./in/c0/../c0/f0.wav,b\n");
  auto args = test::build_args(d / "in", d / "out", {"--manifest", (d / "m.csv").string()});
  args.erase(std::find(args.begin(), args.end(), "--input"), std::find(args.begin(), args.end(), "--input") + 2);
  const auto r = test::run_child(args, d / "build.log");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("m.csv:5: line 5 ('./in/c0/../c0/f0.wav') lists the same file as line 2 "
                                       "('in/c0/f0.wav')"));
  CHECK(nothing_installed(d / "out"));
}

}  // namespace melforge_test_scan_build
