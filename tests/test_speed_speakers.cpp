// melforge-build --speed-speakers (issue 32): speed perturbation as new speakers, train only, classes appended,
// the speed_speaker dataset, the report, merge of shards and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "augment_build_fixture.h"
#include "build_fixture.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_speed_speakers {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::SplitData;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A tone corpus of 3 classes of 3 short files each (plus a stereo 16 kHz file each), float32 frames.
builder::BuildConfig small_config(const fs::path& in, const fs::path& out) {
  auto c = test::tone_build_config(in, out);
  c.build.dtype = mel::DType::float32;
  return c;
}

/// The speed_speaker dataset of a split file.
std::vector<float> speed_speaker(const fs::path& file) {
  auto f = h5::open_file(file);
  return h5::read_float(h5::open_dataset(f, builder::kSpeedSpeakerDataset));
}

}  // namespace

TEST_CASE("speed speakers: new classes and rows in train only, frames of a --speed copy at the same factor",
          "[speed_speakers][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 3);
  builder::run_build(small_config(d / "in", d / "plain"));
  auto c = small_config(d / "in", d / "sp");
  c.build.speed_speakers = "0.9,1.1";
  const auto r = builder::run_build(c).report;
  auto speed = small_config(d / "in", d / "speed");
  speed.augment.copies = 1;
  speed.augment.speed = "0.9";
  builder::run_build(speed);

  const SplitData plain = read_split(d / "plain/train.h5");
  const SplitData sp = read_split(d / "sp/train.h5");
  const SplitData sped = read_split(d / "speed/train.h5");
  const std::vector<float> factor = speed_speaker(d / "sp/train.h5");
  const std::vector<std::string> original = plain.classes;
  std::vector<std::string> want_classes = original;
  for (const std::string f : {"0.9", "1.1"})
    for (const auto& name : original) want_classes.push_back(name + "_sp" + f);
  CHECK(sp.classes == want_classes);
  REQUIRE(sp.files() == 3 * plain.files());
  std::map<int32_t, int64_t> per_class;
  for (std::size_t i = 0; i < plain.files(); ++i) {
    INFO(plain.path[i]);
    const std::size_t row = 3 * i;
    CHECK(sp.path[row] == plain.path[i]);
    CHECK(sp.label[row] == plain.label[i]);
    CHECK(sp.clip(row) == plain.clip(i));
    CHECK(factor[row] == 1.0f);
    for (const int k : {1, 2}) {
      CHECK(sp.path[row + k] == plain.path[i]);
      CHECK(factor[row + k] == (k == 1 ? 0.9f : 1.1f));
      CHECK(sp.classes[static_cast<std::size_t>(sp.label[row + k])] ==
            original[static_cast<std::size_t>(plain.label[i])] + (k == 1 ? "_sp0.9" : "_sp1.1"));
      ++per_class[sp.label[row + k]];
    }
    CHECK(sp.clip(row + 1) == sped.clip(2 * i + 1));
    CHECK(sp.clips.num_samples[row + 1] == sped.clips.num_samples[2 * i + 1]);
    CHECK(sp.clips.num_samples[row + 1] > sp.clips.num_samples[row]);
    CHECK(sp.clips.num_samples[row + 2] < sp.clips.num_samples[row]);
  }
  CHECK(per_class.size() == 6);
  for (const std::string split : {"val", "test"}) {
    INFO(split);
    const SplitData p = read_split(d / "plain" / (split + ".h5"));
    const SplitData s = read_split(d / "sp" / (split + ".h5"));
    CHECK(s.classes == want_classes);
    CHECK(s.path == p.path);
    CHECK(s.label == p.label);
    CHECK(s.frames == p.frames);
    CHECK(speed_speaker(d / "sp" / (split + ".h5")) == std::vector<float>(p.files(), 1.0f));
    CHECK(r["files"]["per_split"][split] == p.files());
  }
  const auto& rep = r["speed_speakers"];
  CHECK(rep["factors"] == nlohmann::json({0.9, 1.1}));
  CHECK(rep["original_classes"] == 3);
  CHECK(rep["classes_added"] == 6);
  CHECK(rep["utterances_added"] == 2 * plain.files());
  CHECK(rep["rows_added"] == 2 * plain.files());
  double seconds = 0;
  for (std::size_t i = 0; i < sp.files(); ++i)
    if (factor[i] != 1.0f) seconds += static_cast<double>(sp.clips.num_samples[i]) / 8000.0;
  CHECK(rep["seconds_added"].get<double>() == Approx(seconds));
  CHECK(rep["per_factor"]["0.9"]["utterances_added"] == plain.files());
  CHECK(rep["per_factor"]["1.1"]["classes_added"] == 3);
  CHECK(r["files"]["per_split"]["train"] == sp.files());
  CHECK(r["counts"]["train"]["class0_sp0.9"].get<int64_t>() == per_class.at(3));
  CHECK(r["counts"]["val"]["class0_sp0.9"] == 0);
  CHECK(r["classes"] == want_classes);
  auto f = h5::open_file(d / "sp/train.h5");
  CHECK(h5::read_attribute_string(f, "speed_speakers") == "0.9,1.1");
  auto pf = h5::open_file(d / "plain/train.h5");
  CHECK_FALSE(h5::exists(pf, builder::kSpeedSpeakerDataset));
  CHECK(h5::read_attribute_string(f, "build_id") != h5::read_attribute_string(pf, "build_id"));
}

TEST_CASE("speed speakers with --augment-copies: each new utterance is followed by its own augmented copies",
          "[speed_speakers][augment][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  test::augment_fixture::write_banks(d / "banks");
  auto c = test::augment_fixture::augment_config(d / "in", d / "banks", d / "out", 1);
  c.build.speed_speakers = "0.9";
  const auto r = builder::run_build(c).report;
  const SplitData train = read_split(d / "out/train.h5");
  const builder::RecipeColumns rec = test::augment_fixture::read_recipes(d / "out/train.h5");
  const std::vector<float> factor = speed_speaker(d / "out/train.h5");
  REQUIRE(train.files() % 4 == 0);
  for (std::size_t g = 0; g < train.files(); g += 4) {
    INFO(train.path[g]);
    CHECK(std::vector<int32_t>(rec.copy.begin() + static_cast<std::ptrdiff_t>(g),
                               rec.copy.begin() + static_cast<std::ptrdiff_t>(g + 4)) ==
          std::vector<int32_t>{0, 1, 0, 1});
    CHECK(std::vector<float>(factor.begin() + static_cast<std::ptrdiff_t>(g),
                             factor.begin() + static_cast<std::ptrdiff_t>(g + 4)) ==
          std::vector<float>{1.0f, 1.0f, 0.9f, 0.9f});
    CHECK(train.label[g] == train.label[g + 1]);
    CHECK(train.label[g + 2] == train.label[g + 3]);
    CHECK(train.classes[static_cast<std::size_t>(train.label[g + 2])] ==
          train.classes[static_cast<std::size_t>(train.label[g])] + "_sp0.9");
    const double want = static_cast<double>(train.clips.num_samples[g]) / (0.9 * rec.speed[g + 3]);
    CHECK(std::abs(static_cast<double>(train.clips.num_samples[g + 3]) - want) <= 3.0);
  }
  const std::size_t groups = train.files() / 4;
  CHECK(r["speed_speakers"]["utterances_added"] == groups);
  CHECK(r["speed_speakers"]["rows_added"] == 2 * groups);
  CHECK(r["augmentation"]["copies"]["train"]["clean"] == 2 * groups);
  CHECK(speed_speaker(d / "out/val.h5") == std::vector<float>(read_split(d / "out/val.h5").files(), 1.0f));
}

TEST_CASE("speed speakers: a merge of two shards equals the unsharded build, and shards with and without are refused",
          "[speed_speakers][merge][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 3);
  auto c = small_config(d / "in", d / "whole");
  c.build.speed_speakers = "1.1,0.9";
  const auto whole = builder::run_build(c).report;
  const auto dirs = test::build_shards(c, d / "shards", 2);
  const bool copy = GENERATE(false, true);
  const fs::path merged = d / (copy ? "merged-copy" : "merged");
  const auto r = test::merge_shards(dirs, merged, copy);
  for (const std::string split : {"train", "val", "test"}) {
    INFO(split);
    const SplitData a = read_split(d / "whole" / (split + ".h5"));
    const SplitData b = read_split(merged / (split + ".h5"));
    CHECK(a.classes == b.classes);
    CHECK(a.path == b.path);
    CHECK(a.label == b.label);
    CHECK(a.frames == b.frames);
    CHECK(speed_speaker(d / "whole" / (split + ".h5")) == speed_speaker(merged / (split + ".h5")));
  }
  CHECK(read_split(merged / "train.h5").classes.back() == "class2_sp0.9");
  for (const char* key : {"rows_added", "utterances_added", "classes_added"})
    CHECK(r["speed_speakers"][key] == whole["speed_speakers"][key]);
  CHECK(r["speed_speakers"]["seconds_added"].get<double>() ==
        Approx(whole["speed_speakers"]["seconds_added"].get<double>()));
  CHECK(r["speed_speakers"]["per_factor"]["1.1"]["rows_added"] ==
        whole["speed_speakers"]["per_factor"]["1.1"]["rows_added"]);

  auto without = c;
  without.build.speed_speakers = "";
  without.build.shard = "2/2";
  without.build.output = d / "plain-2";
  builder::run_build(without);
  builder::MergeOptions m;
  m.shards = {dirs[0], d / "plain-2"};
  m.output = d / "mixed";
  CHECK_THROWS_WITH(builder::run_merge(m), Catch::Contains("--speed-speakers"));
  CHECK_FALSE(fs::exists(d / "mixed/train.h5"));
}

TEST_CASE("bad --speed-speakers values are refused before any output exists",
          "[speed_speakers]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  auto c = small_config(d / "in", d / "out");
  const std::string value = GENERATE(std::string("1"), std::string("0.9,0.9"), std::string("0.9,0.90"),
                                     std::string("3"), std::string("0"), std::string("-0.9"), std::string("x"),
                                     std::string("0.9,"), std::string("0.6,0.7,0.8,0.9,1.1,1.2,1.3,1.4,1.5"));
  c.build.speed_speakers = value;
  INFO(value);
  CHECK_THROWS_AS(builder::run_build(c), InvalidArgument);
  CHECK_THROWS_WITH(builder::run_build(c), Catch::Contains("--speed-speakers"));
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("speed speakers are refused for a multi-label corpus and for a new class name the corpus already has",
          "[speed_speakers]") {
  TempDir d;
  const std::string which = GENERATE(std::string("multilabel"), std::string("taken"));
  std::string manifest;
  for (int i = 0; i < 4; ++i) {
    const std::string a = "a/f" + std::to_string(i) + ".wav", b = "b/f" + std::to_string(i) + ".wav";
    test::write_tone(d / "in" / a, 300 + 10 * i, 3000, 8000);
    test::write_tone(d / "in" / b, 600 + 10 * i, 3000, 8000);
    manifest += a + "," + (which == "multilabel" && i == 0 ? "a;b" : "a") + "\n";
    manifest += b + "," + (which == "taken" ? "a_sp0.9" : "b") + "\n";
  }
  std::ofstream(d / "in/manifest.csv") << manifest;
  auto c = small_config(d / "in", d / "out");
  c.build.input.clear();
  c.build.manifest = d / "in/manifest.csv";
  c.build.split = "1,0,0";
  c.build.speed_speakers = "0.9";
  INFO(which);
  CHECK_THROWS_AS(builder::run_build(c), InvalidArgument);
  CHECK_THROWS_WITH(builder::run_build(c), Catch::Contains("--speed-speakers") &&
                                               Catch::Contains(which == "taken" ? "a_sp0.9" : "multi-label"));
  CHECK_FALSE(fs::exists(d / "out"));
}

}  // namespace melforge_test_speed_speakers
