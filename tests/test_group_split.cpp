// Grouped splits, folds (--group-by, --folds, fold columns), the fold -> split rule, the suspicious-layout warnings,
// and the fold/group datasets a build writes and a merge carries (issue 30).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "build_fixture.h"
#include "augment_stage.h"
#include "build_state.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "plan.h"
#include "scan.h"
#include "split.h"
#include "test_util.h"

namespace melforge_test_group_split {

using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;
namespace builder = melforge::builder;
namespace h5 = melforge::h5;
using builder::InputFile;

namespace {

/// A random grouping: `groups` groups of 1..max_size files each, a group's files of one class (every fifth group
/// mixes two), `classes` classes; every tenth file has no group.
std::vector<InputFile> random_corpus(uint64_t seed, int groups, int max_size, int classes) {
  std::mt19937_64 rng(seed);
  std::vector<InputFile> files;
  for (int g = 0; g < groups; ++g) {
    const int size = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_size));
    const int cls = static_cast<int>(rng() % static_cast<uint64_t>(classes));
    for (int i = 0; i < size; ++i) {
      const int c = g % 5 == 4 && i % 2 ? (cls + 1) % classes : cls;
      InputFile f{{}, "g" + std::to_string(g) + "/f" + std::to_string(i) + ".wav", "c" + std::to_string(c), -1, {},
                  0, "spk" + std::to_string(g)};
      if ((g * 7 + i) % 10 == 9) f.group.clear();
      files.push_back(f);
    }
  }
  return files;
}

/// Group -> the set of values `field` takes over its files (files without a group left out).
std::map<std::string, std::set<int>> per_group(const std::vector<InputFile>& files, int InputFile::*field) {
  std::map<std::string, std::set<int>> out;
  for (const auto& f : files)
    if (!f.group.empty()) out[f.group].insert(f.*field);
  return out;
}

/// rel_path -> value of `field`.
std::map<std::string, int> by_path(const std::vector<InputFile>& files, int InputFile::*field) {
  std::map<std::string, int> out;
  for (const auto& f : files) out[f.rel_path] = f.*field;
  return out;
}

}  // namespace

TEST_CASE("grouped splits: no group in two splits, counts near the ratios, independent of order", "[protocol][split]") {
  const uint64_t seed = GENERATE(range(1, 13));
  const int max_size = GENERATE(1, 3);
  CAPTURE(seed, max_size);
  auto files = random_corpus(seed, 300, max_size, 4);
  auto shuffled = files;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(seed + 1000));
  const std::vector<double> ratios{0.7, 0.2, 0.1};
  builder::assign_splits(files, ratios, seed);
  builder::assign_splits(shuffled, ratios, seed);
  CHECK(by_path(files, &InputFile::split) == by_path(shuffled, &InputFile::split));
  for (const auto& [group, splits] : per_group(files, &InputFile::split)) {
    CAPTURE(group);
    CHECK(splits.size() == 1);
  }
  std::array<double, 3> n{};
  std::map<std::string, std::array<double, 3>> per_class;
  for (const auto& f : files) {
    REQUIRE(f.split >= 0);
    n[static_cast<std::size_t>(f.split)] += 1;
    per_class[f.label][static_cast<std::size_t>(f.split)] += 1;
  }
  const double total = static_cast<double>(files.size());
  for (std::size_t s = 0; s < 3; ++s) {
    CAPTURE(s, n[s]);
    CHECK(std::abs(n[s] - total * ratios[s]) <= 0.02 * total + 2.0 * max_size);
  }
  for (const auto& [label, counts] : per_class) {
    const double c = counts[0] + counts[1] + counts[2];
    CAPTURE(label, counts[0], counts[1], counts[2]);
    CHECK(std::abs(counts[0] - c * ratios[0]) <= 0.05 * c + 2.0 * max_size);
  }
  CHECK(builder::group_leaks(files).empty());
}

TEST_CASE("melforge-build --folds: no group in two folds, folds balanced, stratified, independent of "
          "order", "[protocol][split]") {
  const uint64_t seed = GENERATE(range(1, 9));
  const int k = GENERATE(2, 5, 10);
  CAPTURE(seed, k);
  auto files = random_corpus(seed, 250, 3, 3);
  for (std::size_t i = 0; i < files.size(); i += 17)
    files[i].fold = 1 + static_cast<int>(i % static_cast<std::size_t>(k));
  const auto given = by_path(files, &InputFile::fold);
  auto shuffled = files;
  std::reverse(shuffled.begin(), shuffled.end());
  builder::assign_folds(files, k, seed);
  builder::assign_folds(shuffled, k, seed);
  CHECK(by_path(files, &InputFile::fold) == by_path(shuffled, &InputFile::fold));
  std::vector<double> n(static_cast<std::size_t>(k), 0.0);
  for (const auto& f : files) {
    REQUIRE(f.fold >= 1);
    REQUIRE(f.fold <= k);
    if (given.at(f.rel_path) > 0) CHECK(f.fold == given.at(f.rel_path));
    n[static_cast<std::size_t>(f.fold - 1)] += 1;
  }
  const double total = static_cast<double>(files.size());
  for (int j = 0; j < k; ++j) {
    CAPTURE(j, n[static_cast<std::size_t>(j)]);
    CHECK(std::abs(n[static_cast<std::size_t>(j)] - total / k) <= 0.03 * total + 6);
  }
  // Given folds may put one group in two folds (a warning); the assignment adds no other.
  std::set<std::string> split_by_given;
  for (const auto& [group, folds] : per_group(files, &InputFile::fold))
    if (folds.size() > 1) split_by_given.insert(group);
  for (const auto& group : split_by_given) {
    std::set<int> given_folds;
    for (const auto& f : files)
      if (f.group == group && given.at(f.rel_path) > 0) given_folds.insert(given.at(f.rel_path));
    CAPTURE(group);
    CHECK(given_folds.size() > 1);
  }
  CHECK_THROWS_WITH(builder::assign_folds(files, k - 1, seed), Catch::Contains("--folds " + std::to_string(k - 1)));
}

TEST_CASE("the fold -> split rule: fold K test, fold K-1 val, the others train, given splits kept, K 2 has no val",
          "[protocol][split]") {
  std::vector<InputFile> files;
  for (int fold = 1; fold <= 5; ++fold)
    files.push_back({{}, "f" + std::to_string(fold) + ".wav", "dog", fold == 2 ? 2 : -1, {}, fold, {}});
  CHECK(builder::splits_from_folds(files, 5) == 4);
  CHECK(by_path(files, &InputFile::split) ==
        std::map<std::string, int>{{"f1.wav", 0}, {"f2.wav", 2}, {"f3.wav", 0}, {"f4.wav", 1}, {"f5.wav", 2}});
  std::vector<InputFile> two = {{{}, "a.wav", "dog", -1, {}, 1, {}}, {{}, "b.wav", "dog", -1, {}, 2, {}}};
  CHECK(builder::splits_from_folds(two, 2) == 2);
  CHECK(by_path(two, &InputFile::split) == std::map<std::string, int>{{"a.wav", 0}, {"b.wav", 2}});
}

TEST_CASE("a group given two splits or two folds is a leakage warning naming it", "[protocol][split]") {
  std::vector<InputFile> files = {{{}, "a/1.wav", "dog", 0, {}, 1, "spk1"},
                                  {{}, "a/2.wav", "dog", 2, {}, 1, "spk1"},
                                  {{}, "b/1.wav", "dog", 0, {}, 2, "spk2"},
                                  {{}, "b/2.wav", "dog", 0, {}, 3, "spk2"},
                                  {{}, "c/1.wav", "dog", 1, {}, 4, "spk3"}};
  const auto w = builder::group_leaks(files);
  REQUIRE(w.size() == 2);
  CHECK_THAT(w[0], Catch::Contains("group 'spk1' lies in 2 splits: train (a/1.wav), test (a/2.wav)"));
  CHECK_THAT(w[1], Catch::Contains("group 'spk2' lies in 2 folds: fold 2 (b/1.wav), fold 3 (b/2.wav)"));
  files[1].split = -1;
  builder::assign_splits(files, {0.8, 0.1, 0.1}, 3);
  CHECK(files[1].split == 0);
}

TEST_CASE("melforge-build --group-by REGEX: Speech Commands' speaker before _nohash_, a path it misses is an error",
          "[protocol][scan]") {
  builder::ScanResult scan;
  for (const char* p : {"yes/0a7c2a8d_nohash_0.wav", "yes/0a7c2a8d_nohash_1.wav", "no/0a7c2a8d_nohash_0.wav",
                        "no/1b2c3d4e_nohash_2.wav"})
    scan.files.push_back({{}, p, std::string(p).substr(0, std::string(p).find('/')), -1, {}, 0, {}});
  builder::apply_group_regex(scan, "^[^/]+/([^_]+)_nohash_");
  CHECK(scan.group_by == "regex ^[^/]+/([^_]+)_nohash_");
  CHECK(scan.files[0].group == "0a7c2a8d");
  CHECK(scan.files[2].group == "0a7c2a8d");
  CHECK(scan.files[3].group == "1b2c3d4e");
  builder::apply_group_regex(scan, "^[a-z]+");
  CHECK(scan.files[3].group == "no");

  scan.files.push_back({{}, "_background_noise_/white.wav", "_background_noise_", -1, {}, 0, {}});
  CHECK_THROWS_AS(builder::apply_group_regex(scan, "^[^/]+/([^_]+)_nohash_"), melforge::FormatError);
  CHECK_THROWS_WITH(builder::apply_group_regex(scan, "^[^/]+/([^_]+)_nohash_"),
                    Catch::Contains("_background_noise_/white.wav: --group-by"));
  CHECK_THROWS_AS(builder::apply_group_regex(scan, "(["), melforge::InvalidArgument);
}

namespace {

/// The warnings label_files gives for `files` (a manifest corpus, or a folder one with `folder`).
std::vector<std::string> label_warnings(std::vector<InputFile> files, bool folder) {
  builder::BuildConfig c;
  (folder ? c.build.input : c.build.manifest) = "corpus";
  c.build.quiet = true;
  builder::BuildState state(c);
  state.scan.files = std::move(files);
  builder::label_files(state);
  return state.scan.warnings;
}

/// `per_class` files of each class of `classes`.
std::vector<InputFile> class_files(const std::vector<std::string>& classes, int per_class) {
  std::vector<InputFile> files;
  for (const auto& c : classes)
    for (int i = 0; i < per_class; ++i)
      files.push_back({{}, c + "/" + std::to_string(i) + ".wav", c, -1, {}, 0, {}});
  return files;
}

/// True when a warning of `warnings` contains `text`.
bool has(const std::vector<std::string>& warnings, const std::string& text) {
  return std::any_of(warnings.begin(), warnings.end(),
                     [&text](const std::string& w) { return w.find(text) != std::string::npos; });
}

}  // namespace

TEST_CASE("suspicious layouts warn: one class, fold or split names, '_' names, one-file classes", "[protocol][warn]") {
  const auto [classes, per_class, text] = GENERATE(table<std::vector<std::string>, int, std::string>({
      {{"audio"}, 5, "a single class, 'audio'"},
      {{"fold1", "fold2", "fold10"}, 4, "class folder names that look like folds or splits, not classes: 'fold1', "
                                        "'fold10', 'fold2'"},
      {{"fold_3", "dog"}, 4, "'fold_3'"},
      {{"split2", "dog"}, 4, "'split2'"},
      {{"dog", "train"}, 4, "'train'"},
      {{"dev", "eval"}, 4, "'dev', 'eval'"},
      {{"_background_noise_", "yes", "no"}, 4, "class folder '_background_noise_' starts with '_'"},
      {{"cat", "dog"}, 1, "2 classes have a single file, which cannot be in both train and test: 'cat', 'dog'"},
  }));
  CAPTURE(text);
  CHECK(has(label_warnings(class_files(classes, per_class), true), text));
}

TEST_CASE("an ordinary corpus gets none of the suspicious-layout warnings", "[protocol][warn]") {
  auto files = class_files({"cat", "dog", "bird"}, 6);
  files.push_back({{}, "cat/x.wav", "cat", -1, {}, 0, {}});
  const auto w = label_warnings(files, true);
  for (const auto& text : {"single class", "look like folds", "starts with '_'", "a single file"}) {
    CAPTURE(text);
    CHECK_FALSE(has(w, text));
  }
  // A one-file class of a manifest is named as a class, not a folder.
  auto one = class_files({"cat", "dog"}, 3);
  one.push_back({{}, "x.wav", "_odd", -1, {}, 0, {}});
  const auto m = label_warnings(one, false);
  CHECK(has(m, "class '_odd' starts with '_'"));
  CHECK(has(m, "1 class has a single file"));
}

TEST_CASE("class order from a classes file, listed classes without files are kept with a warning",
          "[protocol][warn]") {
  builder::BuildConfig c;
  c.build.manifest = "m.csv";
  c.build.quiet = true;
  builder::BuildState state(c);
  state.scan.files = class_files({"b", "a"}, 4);
  state.scan.class_order = {"z", "b", "a"};
  builder::label_files(state);
  CHECK(state.class_names == std::vector<std::string>{"z", "b", "a"});
  CHECK(state.class_index.at("a") == 2);
  CHECK(has(state.scan.warnings, "1 listed class has no file (kept, so that every class keeps its index): 'z'"));
}

namespace {

/// A manifest corpus of tiny tones in `d`/in: `per_class` files of classes a, b, c, each with a fold column
/// (1..5 round robin) and a group (two files a group); returns the manifest path.
fs::path fold_corpus(const TempDir& d, int per_class) {
  std::string csv = "file,class,fold,group\n";
  int n = 0;
  for (const char* c : {"a", "b", "c"})
    for (int i = 0; i < per_class; ++i, ++n) {
      const std::string name = std::string(c) + std::to_string(i) + ".wav";
      melforge::test::write_tone(d / "in" / name, 300.0 + 50 * n, 1600, 8000);
      csv += "in/" + name + "," + c + "," + std::to_string(i % 5 + 1) + ",src" + std::to_string(n / 2) + "\n";
    }
  write_text(d / "m.csv", csv);
  return d / "m.csv";
}

}  // namespace

TEST_CASE("a build with folds and groups writes fold, group and the folds attribute, merge carries them",
          "[protocol][e2e]") {
  TempDir d;
  auto c = melforge::test::tone_build_config({}, d / "out");
  c.build.manifest = fold_corpus(d, 5);
  c.build.split_given = true;
  builder::run_build(c);
  std::map<std::string, int> fold_of;
  for (const char* split : {"train", "val", "test"}) {
    auto f = h5::open_file(d / "out" / (std::string(split) + ".h5"));
    CHECK(h5::read_attribute_int64(f, "folds") == 5);
    const auto folds = h5::read_int32(f, "fold");
    const auto groups = h5::read_strings(f, "group");
    const auto paths = h5::read_strings(f, "path");
    REQUIRE(folds.size() == paths.size());
    REQUIRE(groups.size() == paths.size());
    for (std::size_t i = 0; i < paths.size(); ++i) {
      fold_of[paths[i]] = folds[i];
      const int expect = std::string(split) == "test" ? 5 : std::string(split) == "val" ? 4 : -1;
      CAPTURE(paths[i], folds[i]);
      if (expect > 0) CHECK(folds[i] == expect);
      else CHECK(folds[i] <= 3);
      CHECK(groups[i].rfind("src", 0) == 0);
    }
  }
  CHECK(fold_of.size() == 15);
  std::ifstream in(d / "out/build_report.json");
  const auto report = nlohmann::json::parse(in);
  CHECK(report["protocol"]["folds"] == 5);
  CHECK(report["protocol"]["fold_counts"]["1"] == 3);
  CHECK(report["protocol"]["group_by"] == "column group");
  CHECK(report["protocol"]["groups"] == 8);
  CHECK(report["protocol"]["class_order"] == "sorted");
  CHECK(std::any_of(report["warnings"].begin(), report["warnings"].end(), [](const nlohmann::json& w) {
    return w.get<std::string>().find("--split 0.6,0.2,0.2 is not used") != std::string::npos;
  }));

  c.build.split_given = false;
  const auto shards = melforge::test::build_shards(c, d / "shards", 2);
  builder::MergeOptions m;
  m.output = d / "merged";
  m.shards = shards;
  builder::run_merge(m);
  auto merged = h5::open_file(d / "merged/train.h5");
  auto single = h5::open_file(d / "out/train.h5");
  CHECK(h5::read_int32(merged, "fold") == h5::read_int32(single, "fold"));
  CHECK(h5::read_strings(merged, "group") == h5::read_strings(single, "group"));
  CHECK(h5::read_attribute_int64(merged, "folds") == 5);
}

TEST_CASE("melforge-build --folds K assigns grouped folds in a build, a corpus without folds writes no fold dataset",
          "[protocol][e2e]") {
  TempDir d;
  std::string csv;
  for (int i = 0; i < 12; ++i) {
    const std::string name = "in/g" + std::to_string(i / 2) + "_" + std::to_string(i) + ".wav";
    melforge::test::write_tone(d / name, 300.0 + 40 * i, 1600, 8000);
    csv += name + "," + (i % 2 ? "x" : "y") + "\n";
  }
  write_text(d / "m.csv", csv);
  auto c = melforge::test::tone_build_config({}, d / "plain");
  c.build.manifest = d / "m.csv";
  builder::run_build(c);
  auto plain = h5::open_file(d / "plain/train.h5");
  CHECK_FALSE(h5::exists(plain, "fold"));
  CHECK_FALSE(h5::exists(plain, "group"));
  CHECK_FALSE(h5::has_attribute(plain, "folds"));

  c.build.output = d / "folds";
  c.build.folds = 3;
  c.build.group_by = "^in/(g[0-9]+)_";
  const auto result = builder::run_build(c);
  CHECK(result.report["protocol"]["group_by"] == "regex ^in/(g[0-9]+)_");
  CHECK(result.report["protocol"]["groups"] == 6);
  std::map<std::string, int> fold_of;
  std::array<int, 3> per_fold{};
  for (const char* split : {"train", "val", "test"}) {
    auto f = h5::open_file(d / "folds" / (std::string(split) + ".h5"));
    CHECK(h5::read_attribute_int64(f, "folds") == 3);
    const auto folds = h5::read_int32(f, "fold");
    const auto paths = h5::read_strings(f, "path");
    const int expect = std::string(split) == "test" ? 3 : std::string(split) == "val" ? 2 : 1;
    for (std::size_t i = 0; i < paths.size(); ++i) {
      CHECK(folds[i] == expect);
      fold_of[paths[i]] = folds[i];
      ++per_fold[static_cast<std::size_t>(folds[i] - 1)];
    }
  }
  REQUIRE(fold_of.size() == 12);
  CHECK(per_fold == std::array<int, 3>{4, 4, 4});
  for (int g = 0; g < 6; ++g) {
    CAPTURE(g);
    const std::string stem = "in/g" + std::to_string(g) + "_";
    CHECK(fold_of[stem + std::to_string(2 * g) + ".wav"] == fold_of[stem + std::to_string(2 * g + 1) + ".wav"]);
  }
}

TEST_CASE("a multi-label file counts for every one of its labels in the training-file check", "[protocol][e2e]") {
  TempDir d;
  std::string csv = "path,label,split\n";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"a0", "low;high,train"}, {"a1", "low;high,train"}, {"a2", "high,val"}, {"a3", "low,test"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    melforge::test::write_tone(d / "in" / (rows[i].first + ".wav"), 300 + 100 * static_cast<double>(i), 1600, 8000);
    csv += "in/" + rows[i].first + ".wav,\"" + rows[i].second.substr(0, rows[i].second.find(',')) + "\"," +
           rows[i].second.substr(rows[i].second.find(',') + 1) + "\n";
  }
  write_text(d / "m.csv", csv);
  auto c = melforge::test::tone_build_config({}, d / "out");
  c.build.manifest = d / "m.csv";
  const auto result = builder::run_build(c);
  for (const auto& w : result.report["warnings"]) {
    CAPTURE(w);
    CHECK(w.get<std::string>().find("has no training file") == std::string::npos);
  }
}

TEST_CASE("a layout's noise bank stands in for a missing --noise, its trial list is staged as trials.txt",
          "[protocol][layout]") {
  TempDir d;
  melforge::test::write_tone(d / "_background_noise_/white.wav", 440, 800, 8000);
  builder::BuildConfig c;
  c.build.layout = "speechcommands";
  c.build.input = d.path();
  c.augment.copies = 2;
  builder::BuildState state(c);
  REQUIRE(state.augment);
  state.scan.noise_bank = d / "_background_noise_";
  CHECK(builder::use_layout_noise_bank(c, state) == (d / "_background_noise_").string());
  CHECK(c.augment.noise == d / "_background_noise_");
  CHECK(state.augment->args().noise == d / "_background_noise_");

  SECTION("no bank and nothing else to augment with is refused as before") {
    builder::BuildConfig none;
    none.build.layout = "esc50";
    none.augment.copies = 1;
    builder::BuildState bare(none);
    CHECK_THROWS_AS(builder::use_layout_noise_bank(none, bare), melforge::InvalidArgument);
    CHECK_THROWS_WITH(builder::use_layout_noise_bank(none, bare), Catch::Contains("--augment-copies"));
  }
  SECTION("a given --noise, or no --layout, is left alone") {
    builder::BuildConfig given;
    given.build.layout = "speechcommands";
    given.augment.copies = 1;
    given.augment.noise = d / "mine";
    builder::BuildState s(given);
    s.scan.noise_bank = d / "_background_noise_";
    CHECK(builder::use_layout_noise_bank(given, s).empty());
    CHECK(given.augment.noise == d / "mine");
    given.build.layout.clear();
    given.augment.noise.clear();
    CHECK(builder::use_layout_noise_bank(given, s).empty());
    CHECK(given.augment.noise.empty());
  }
  SECTION("the trial list is copied byte for byte") {
    const std::string trials = "1 id10270/x6uYqmx31kE/00001.wav id10270/8jEAjG6SegY/00008.wav\n"
                               "0 id10270/x6uYqmx31kE/00001.wav id10300/ize_eiCFEg0/00003.wav\n";
    write_text(d / "veri_test2.txt", trials);
    fs::create_directories(d / "staging");
    const fs::path staged = builder::stage_trials(d / "veri_test2.txt", d / "staging");
    CHECK(staged == d / "staging/trials.txt");
    std::ifstream in(staged, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == trials);
    CHECK_THROWS_AS(builder::stage_trials(d / "missing.txt", d / "staging"), melforge::Error);
  }
}

}  // namespace melforge_test_group_split
