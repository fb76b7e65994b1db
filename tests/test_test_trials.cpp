// melforge-build --split-by class --test-trials LIST (issue 32): the trial list's speakers are the test split, the
// other classes train and val; paths as stored or as the one stored path ending in /<path>; the refusals.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include "build_fixture.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_test_trials {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A VoxCeleb-like tree `<root>/<prefix><speaker>/<video>/<utt>.wav`: 8 speakers id0..id7, 2 videos of 2 short
/// utterances each. `prefix` ("" or "wav/") puts the speakers in a sub-folder.
void write_speakers(const fs::path& root, const std::string& prefix = "") {
  for (int s = 0; s < 8; ++s)
    for (int v = 0; v < 2; ++v)
      for (int u = 0; u < 2; ++u)
        test::write_tone(root / (prefix + "id" + std::to_string(s)) / ("v" + std::to_string(v)) /
                             ("0000" + std::to_string(u) + ".wav"),
                         200.0 + 50 * s + 10 * v + u, 2400 + 200 * u, 8000);
}

/// A trial list over speakers id1, id4 and id6, paths relative to the speakers' folder (VoxCeleb1's veri_test2.txt).
const char* kTrials =
    "1 id1/v0/00000.wav id1/v1/00001.wav\n"
    "0 id1/v0/00000.wav id4/v0/00001.wav\n"
    "\n"
    "0 id4/v1/00000.wav id6/v0/00000.wav\r\n"
    "1 id6/v0/00000.wav id6/v1/00001.wav\n";

builder::BuildConfig trials_config(const fs::path& in, const fs::path& list, const fs::path& out) {
  auto c = test::tone_build_config(in, out);
  c.build.split_by = builder::SplitBy::class_;
  c.build.split = "0.6,0.2,0.2";
  c.build.test_trials = list;
  return c;
}

/// The classes of the rows of a split file.
std::set<std::string> classes_of(const fs::path& file) {
  const test::SplitData d = read_split(file);
  std::set<std::string> out;
  for (const int32_t l : d.label) out.insert(d.classes[static_cast<std::size_t>(l)]);
  return out;
}

}  // namespace

TEST_CASE("test trials: puts exactly the list's speakers in test, the others in train and val",
          "[test_trials][e2e]") {
  TempDir d;
  const bool manifest = GENERATE(false, true);
  INFO((manifest ? "a manifest whose paths start with wav/" : "a folder of speakers"));
  auto c = trials_config(d / "in", d / "veri_test2.txt", d / "out");
  if (manifest) {
    write_speakers(d / "in", "wav/");
    std::string rows;
    for (int s = 0; s < 8; ++s)
      for (const char* u : {"v0/00000.wav", "v0/00001.wav", "v1/00000.wav", "v1/00001.wav"})
        rows += "wav/id" + std::to_string(s) + "/" + u + ",id" + std::to_string(s) + "\n";
    test::write_text(d / "in/manifest.csv", rows);
    c.build.input.clear();
    c.build.manifest = d / "in/manifest.csv";
  } else {
    write_speakers(d / "in");
  }
  test::write_text(d / "veri_test2.txt", kTrials);
  const auto r = builder::run_build(c).report;
  CHECK(classes_of(d / "out/test.h5") == std::set<std::string>{"id1", "id4", "id6"});
  const auto train = classes_of(d / "out/train.h5");
  const auto val = classes_of(d / "out/val.h5");
  CHECK_FALSE(val.empty());
  std::set<std::string> rest(train.begin(), train.end());
  for (const auto& v : val) CHECK(rest.insert(v).second);
  CHECK(rest == std::set<std::string>{"id0", "id2", "id3", "id5", "id7"});
  CHECK(r["files"]["per_split"]["test"] == 12);
  CHECK(read_regular_file(d / "out/trials.txt", "trial list") == kTrials);
  CHECK(r["protocol"]["trials"] == "trials.txt");
  CHECK(r["protocol"]["test_trials"]["trials"] == 4);
  CHECK(r["protocol"]["test_trials"]["speakers"] == 3);
  CHECK(r["protocol"]["test_trials"]["files"] == 12);
  CHECK(r["protocol"]["test_trials"]["list"] == (d / "veri_test2.txt").string());
}

TEST_CASE("test trials: an unknown or ambiguous path is an error naming the list and line, before any output",
          "[test_trials]") {
  TempDir d;
  write_speakers(d / "in");
  const std::string which = GENERATE(std::string("unknown"), std::string("ambiguous"), std::string("malformed"));
  std::string list = kTrials;
  std::string want = "veri_test2.txt:4: ";
  if (which == "unknown") list.replace(list.find("id4/v1/00000.wav"), 16, "id4/v9/00000.wav");
  if (which == "ambiguous") {
    test::write_tone(d / "in/id3/x/v1/00000.wav", 440, 2400, 8000);
    list.replace(list.find("id4/v1/00000.wav"), 16, "v1/00000.wav");
  }
  if (which == "malformed") list.replace(list.find("0 id4/v1"), 1, "2"), want = "veri_test2.txt:4: expected";
  test::write_text(d / "veri_test2.txt", list);
  INFO(which);
  const auto c = trials_config(d / "in", d / "veri_test2.txt", d / "out");
  CHECK_THROWS_AS(builder::run_build(c), FormatError);
  CHECK_THROWS_WITH(builder::run_build(c), Catch::Contains(want));
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("test trials: without --split-by class, with a layout, with folds or on a pre-split corpus is refused "
          "before any work, naming the flags", "[test_trials]") {
  TempDir d;
  write_speakers(d / "in");
  test::write_text(d / "veri_test2.txt", kTrials);
  auto c = trials_config(d / "in", d / "veri_test2.txt", d / "out");
  const std::string which = GENERATE(std::string("split-by"), std::string("layout"), std::string("folds"),
                                     std::string("missing"), std::string("presplit"));
  std::string want;
  if (which == "split-by") c.build.split_by = builder::SplitBy::file, want = "--split-by";
  if (which == "layout") c.build.layout = "voxceleb1", want = "--layout";
  if (which == "folds") c.build.folds = 5, want = "--folds";
  if (which == "missing") c.build.test_trials = d / "nope.txt", want = "nope.txt";
  if (which == "presplit") {
    write_speakers(d / "split/train");
    test::write_tone(d / "split/test/id9/v0/00000.wav", 300, 2400, 8000);
    c.build.input = d / "split";
    want = "gives its own splits";
  }
  INFO(which);
  CHECK_THROWS_AS(builder::run_build(c), InvalidArgument);
  CHECK_THROWS_WITH(builder::run_build(c), Catch::Contains("--test-trials") && Catch::Contains(want));
  CHECK_FALSE(fs::exists(d / "out"));
}

}  // namespace melforge_test_test_trials
