// Open-set splits (issue 19, builder): `--split-by class` puts each class wholly in one split, with the class counts
// of the documented rounding and the best of kClassSplitDraws seeded draws by file count; `--split-by file` (the
// default) is the stratified assignment unchanged. Also the VoxCeleb layout (class = first folder) and 3 s segments.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "build_cli.h"
#include "build_fixture.h"
#include "melforge/common/errors.h"
#include "split.h"
#include "test_util.h"

namespace melforge_test_split_by_class {

using namespace melforge;
using namespace melforge::builder;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// `classes` classes named s<c>, class c holding 1 + (c * 7919) % 23 files (sizes vary from 1 to 23).
std::vector<InputFile> corpus(int classes) {
  std::vector<InputFile> files;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < 1 + (c * 7919) % 23; ++i)
      files.push_back({{}, "s" + std::to_string(c) + "/u" + std::to_string(i) + ".wav", "s" + std::to_string(c), -1,
                       {}, 0, {}});
  return files;
}

std::map<std::string, int> assignment(const std::vector<InputFile>& files) {
  std::map<std::string, int> m;
  for (const auto& f : files) m[f.rel_path] = f.split;
  return m;
}

/// Ratios as exact fractions train/den, val/den: round(n*num/den) half away from zero is (2*n*num + den) / (2*den).
struct Ratios {
  int64_t train, val, den;
  std::vector<double> doubles() const {
    const auto d = static_cast<double>(den);
    return {static_cast<double>(train) / d, static_cast<double>(val) / d, static_cast<double>(den - train - val) / d};
  }
  int64_t rounded(int64_t n, int64_t num) const { return (2 * n * num + den) / (2 * den); }
};

/// The documented class split, written out naively: classes counted out with the file mode's rounding, each draw
/// ordered by class_split_key, the draw with the least sum |files_s - F*ratio_s| kept (first on ties).
std::map<std::string, int> reference_class_splits(const std::map<std::string, int64_t>& sizes, const Ratios& r,
                                                  uint64_t seed) {
  const auto n = static_cast<int64_t>(sizes.size());
  const int64_t k0 = std::min(n, r.rounded(n, r.train));
  const int64_t k1 = std::min(n - k0, r.rounded(n, r.val));
  const std::vector<double> ratios = r.doubles();
  int64_t total = 0;
  for (const auto& [name, size] : sizes) total += size;
  std::map<std::string, int> best;
  double best_cost = INFINITY;
  for (int d = 0; d < kClassSplitDraws; ++d) {
    std::vector<std::pair<uint64_t, std::string>> order;
    for (const auto& [name, size] : sizes) order.emplace_back(class_split_key(name, seed, d), name);
    std::sort(order.begin(), order.end());
    std::map<std::string, int> split;
    std::array<int64_t, 3> files{};
    for (int64_t i = 0; i < n; ++i) {
      const int s = i < k0 ? 0 : (i < k0 + k1 ? 1 : 2);
      split[order[static_cast<std::size_t>(i)].second] = s;
      files[static_cast<std::size_t>(s)] += sizes.at(order[static_cast<std::size_t>(i)].second);
    }
    double cost = 0;
    for (std::size_t s = 0; s < 3; ++s)
      cost += std::fabs(static_cast<double>(files[s]) - static_cast<double>(total) * ratios[s]);
    if (cost < best_cost) {
      best = split;
      best_cost = cost;
    }
  }
  return best;
}

/// The class of every file's split; fails the test when a class has files in two splits.
std::map<std::string, int> class_splits(const std::vector<InputFile>& files) {
  std::map<std::string, int> m;
  for (const auto& f : files) {
    CAPTURE(f.rel_path, f.split);
    REQUIRE((f.split >= 0 && f.split <= 2));
    const auto [it, added] = m.emplace(f.label, f.split);
    CHECK(it->second == f.split);
  }
  return m;
}

/// What assign_class_splits throws for `files`, or "" when it does not.
std::string class_split_error(std::vector<InputFile> files) {
  try {
    assign_class_splits(files, {0.5, 0.25, 0.25}, 1);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("split-by class puts every class in one split with the documented counts and draw", "[split][class]") {
  const Ratios r = GENERATE(Ratios{4, 1, 5}, Ratios{3, 1, 4}, Ratios{1, 1, 2}, Ratios{5, 3, 8}, Ratios{1, 1, 4});
  const int classes = GENERATE(1, 2, 3, 5, 8, 40);
  const uint64_t seed = GENERATE(1u, 42u, 2026u);
  CAPTURE(r.train, r.val, r.den, classes, seed);
  auto files = corpus(classes);
  std::map<std::string, int64_t> sizes;
  for (const auto& f : files) ++sizes[f.label];
  assign_splits(files, r.doubles(), seed, SplitBy::class_);

  const std::map<std::string, int> got = class_splits(files);
  REQUIRE(got.size() == sizes.size());
  std::array<int64_t, 3> per_split{};
  for (const auto& [name, s] : got) ++per_split[static_cast<std::size_t>(s)];
  const int64_t n = classes;
  const int64_t train = std::min(n, r.rounded(n, r.train));
  const int64_t val = std::min(n - train, r.rounded(n, r.val));
  CHECK(per_split == std::array<int64_t, 3>{train, val, n - train - val});
  CHECK(got == reference_class_splits(sizes, r, seed));
}

TEST_CASE("split-by class does not depend on file order, and seeds differ", "[split][class]") {
  const uint64_t seed = GENERATE(0u, 7u, 12345u);
  const int classes = GENERATE(4, 30);
  auto files = corpus(classes);
  auto shuffled = files;
  std::mt19937 rng(static_cast<unsigned>(seed) + 5);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::reverse(files.begin(), files.end());
  assign_class_splits(files, {0.5, 0.25, 0.25}, seed);
  assign_class_splits(shuffled, {0.5, 0.25, 0.25}, seed);
  CHECK(assignment(files) == assignment(shuffled));

  auto other = corpus(30);
  auto again = other;
  assign_class_splits(other, {0.5, 0.25, 0.25}, seed);
  assign_class_splits(again, {0.5, 0.25, 0.25}, seed + 1);
  CHECK(class_splits(other) != class_splits(again));
}

TEST_CASE("split-by file is the default and the per-class stratified assignment", "[split][class]") {
  const uint64_t seed = GENERATE(3u, 42u);
  const std::vector<double> ratios = GENERATE(std::vector<double>{0.8, 0.1, 0.1}, std::vector<double>{0.5, 0.5, 0});
  auto files = corpus(12);
  auto by_file = files;
  assign_splits(files, ratios, seed);
  assign_splits(by_file, ratios, seed, SplitBy::file);
  REQUIRE(assignment(files) == assignment(by_file));

  std::map<std::string, std::vector<std::pair<uint64_t, std::string>>> members;
  for (const auto& f : files) members[f.label].emplace_back(split_key(f.rel_path, seed), f.rel_path);
  std::map<std::string, int> expected;
  for (auto& [label, m] : members) {
    std::sort(m.begin(), m.end());
    const auto n = static_cast<int64_t>(m.size());
    const int64_t train = std::min<int64_t>(n, std::llround(static_cast<double>(n) * ratios[0]));
    const int64_t val = std::min<int64_t>(n - train, std::llround(static_cast<double>(n) * ratios[1]));
    for (int64_t i = 0; i < n; ++i)
      expected[m[static_cast<std::size_t>(i)].second] = i < train ? 0 : (i < train + val ? 1 : 2);
  }
  CHECK(assignment(files) == expected);
}

TEST_CASE("split-by class keeps given splits, their classes whole, and counts the other classes", "[split][class]") {
  const int given_split = GENERATE(0, 1, 2);
  auto files = corpus(9);
  for (auto& f : files)
    if (f.label == "s4" && f.rel_path != "s4/u1.wav") f.split = given_split;
  auto rest = files;
  std::erase_if(rest, [](const InputFile& f) { return f.label == "s4"; });
  assign_class_splits(files, {0.5, 0.25, 0.25}, 9);
  assign_class_splits(rest, {0.5, 0.25, 0.25}, 9);
  std::map<std::string, int> got = class_splits(files);
  CHECK(got.at("s4") == given_split);
  got.erase("s4");
  CHECK(got == class_splits(rest));
}

TEST_CASE("split-by class refuses a class in two given splits, a multi-label row and unknown values",
          "[split][class]") {
  auto files = corpus(3);
  files[3].split = 2;
  files[1].split = 0;
  files[4].split = 2;
  REQUIRE(files[4].label == files[1].label);
  const std::string two = class_split_error(files);
  CHECK_THAT(two, Catch::Contains("class 's1' is in two splits: train (s1/u0.wav) and test (s1/u2.wav)"));

  auto multi = corpus(3);
  multi[1].labels = {multi[1].label, "other"};
  CHECK_THAT(class_split_error(multi), Catch::Contains(multi[1].rel_path + " has several labels"));
  CHECK(class_split_error(corpus(3)).empty());

  CHECK(parse_split_by("Class") == SplitBy::class_);
  CHECK(parse_split_by("FILE") == SplitBy::file);
  CHECK_THROWS_WITH(parse_split_by("speaker"), Catch::Contains("--split-by: 'speaker' is not one of file, class"));
  CHECK(to_string(SplitBy::class_) == "class");
}

TEST_CASE("split-by is a build flag with default file, read in any case, a bad value refused", "[split][class]") {
  const auto parse = [](const std::vector<std::string>& args) {
    BuildConfig config;
    std::string config_file;
    boost::program_options::options_description all;
    add_build_groups(all, config, config_file);
    std::ostringstream help;
    if (!parse_build_args(args, all, help)) return std::make_pair(config, help.str());
    return std::make_pair(config, std::string());
  };
  CHECK(parse({}).first.build.split_by == SplitBy::file);
  CHECK(parse({"--split-by", "Class"}).first.build.split_by == SplitBy::class_);
  CHECK(parse({"--split_by=class"}).first.build.split_by == SplitBy::class_);
  CHECK_THAT(parse({"--help"}).second, Catch::Contains("--split-by arg (=file)"));
  CHECK_THROWS_WITH(parse({"--split-by", "video"}), Catch::Contains("--split-by: 'video' is not one of file, class"));
}

namespace {

/// A VoxCeleb-like tree: root/id1000<s>/<video>/<utt>.wav, 8 kHz tones of `seconds`, two videos of two utterances
/// per speaker.
void write_voxceleb_tree(const fs::path& root, int speakers, double seconds) {
  for (int s = 0; s < speakers; ++s)
    for (int v = 0; v < 2; ++v)
      for (int u = 0; u < 2; ++u)
        test::write_tone(root / ("id1000" + std::to_string(s)) / ("vid" + std::to_string(s * 2 + v)) /
                             ("0000" + std::to_string(u) + ".wav"),
                         200.0 + 150 * s + 20 * u, static_cast<int64_t>(seconds * 8000), 8000);
}

/// The root attributes of `file`.
std::map<std::string, h5::AttributeValue> attributes(const fs::path& file) {
  return h5::read_attributes(h5::open_file(file));
}

/// The bytes of `file`.
std::string bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a VoxCeleb layout scans with the speaker folder as class, and --split-by class keeps speakers apart",
          "[split][class][e2e]") {
  TempDir d;
  write_voxceleb_tree(d / "in", 6, 1.0);
  auto config = test::tone_build_config(d / "in", d / "out");
  config.build.split = "0.5,0.25,0.25";
  config.build.split_by = SplitBy::class_;
  const nlohmann::json report = builder::run_build(config).report;
  CHECK(report["config"]["split_by"] == "class");
  const std::vector<std::string> speakers = {"id10000", "id10001", "id10002", "id10003", "id10004", "id10005"};
  CHECK(report["classes"].get<std::vector<std::string>>() == speakers);
  std::map<std::string, std::set<std::string>> splits_of;
  std::array<int, 3> classes_per_split{};
  for (std::size_t s = 0; s < kSplitNames.size(); ++s) {
    const fs::path file = d / "out" / (kSplitNames[s] + ".h5");
    const test::SplitData data = test::read_split(file);
    CHECK(data.classes == speakers);
    CHECK(attributes(file).at("split_by") == h5::AttributeValue{std::string("class")});
    std::set<std::string> here;
    for (std::size_t i = 0; i < data.path.size(); ++i) {
      const std::string speaker = data.path[i].substr(0, data.path[i].find('/'));
      CHECK(data.classes.at(static_cast<std::size_t>(data.label[i])) == speaker);
      splits_of[speaker].insert(kSplitNames[s]);
      here.insert(speaker);
    }
    classes_per_split[s] = static_cast<int>(here.size());
  }
  CHECK(classes_per_split == std::array<int, 3>{3, 2, 1});
  for (const auto& [speaker, splits] : splits_of) CHECK(splits.size() == 1);
}

TEST_CASE("split-by file, given or not, writes the same bytes and no split_by attribute", "[split][class][e2e]") {
  TempDir d;
  write_voxceleb_tree(d / "in", 3, 1.0);
  auto config = test::tone_build_config(d / "in", d / "default");
  builder::run_build(config);
  config.build.output = d / "file";
  config.build.split_by = SplitBy::file;
  const nlohmann::json report = builder::run_build(config).report;
  CHECK(report["config"]["split_by"] == "file");
  for (const auto& split : kSplitNames) {
    CAPTURE(split);
    CHECK(attributes(d / "default" / (split + ".h5")).count("split_by") == 0);
    CHECK(bytes(d / "default" / (split + ".h5")) == bytes(d / "file" / (split + ".h5")));
  }
}

TEST_CASE("split-by class: a given split emptied by skips fails, too few classes warn", "[split][class][e2e]") {
  TempDir d;
  write_voxceleb_tree(d / "in", 3, 1.0);
  test::write_text(d / "in/short/a.wav", "not audio");
  test::write_text(d / "in/short/b.wav", "not audio either");
  std::string csv = "path,label,split\nin/short/a.wav,short,val\nin/short/b.wav,short,\n";
  for (int s = 0; s < 3; ++s)
    csv += "in/id1000" + std::to_string(s) + "/vid" + std::to_string(2 * s) + "/00000.wav,id1000" + std::to_string(s) +
           ",\n";
  test::write_text(d / "files.csv", csv);
  auto config = test::tone_build_config({}, d / "out");
  config.build.manifest = d / "files.csv";
  config.build.split_by = SplitBy::class_;
  config.build.split = "1,0,0";
  CHECK_THROWS_WITH(builder::run_build(config), Catch::Contains("val would be empty: all 2 files were skipped"));

  config.build.split = "0.8,0.1,0.1";
  config.build.manifest.clear();
  config.build.input = d / "in";
  fs::remove_all(d / "in/short");
  const nlohmann::json report = builder::run_build(config).report;
  CHECK(report["files"]["per_split"]["train"] == 2 * 4);
  CHECK(report["files"]["per_split"]["test"] == 4);
  const std::string warnings = report["warnings"].dump();
  CHECK_THAT(warnings, Catch::Contains("val is empty: too few classes for --split 0.8,0.1,0.1 --split-by class"));
  CHECK_THAT(warnings, !Catch::Contains("no training file"));
}

TEST_CASE("3 s tiles build, and a clip shorter than the tile is stored whole", "[clips][class][e2e]") {
  const double short_seconds = GENERATE(3.0, 1.0);
  CAPTURE(short_seconds);
  TempDir d;
  write_voxceleb_tree(d / "in", 2, 3.5);
  test::write_tone(d / "in/id10000/vid9/short.wav", 440, 2 * 8000, 8000);
  auto config = test::tone_build_config(d / "in", d / "out");
  config.build.split = "1,0,0";
  config.clips.short_seconds = short_seconds;
  const nlohmann::json report = builder::run_build(config).report;
  CHECK(report["config"]["n_frames"] == static_cast<int>(short_seconds * 8000 / 64));
  CHECK(report["files"]["written"] == 9);
  CHECK(report["skipped"].empty());
  CHECK(report["clips"]["padded"] == 0);
  CHECK(report["clips"]["stored_fraction"].get<double>() == Approx(1.0));
  const test::SplitData train = test::read_split(d / "out/train.h5");
  REQUIRE(train.dims.size() == 2);
  const auto row = static_cast<std::size_t>(
      std::find(train.path.begin(), train.path.end(), "id10000/vid9/short.wav") - train.path.begin());
  REQUIRE(row < train.path.size());
  CHECK(train.clips.num_samples[row] == 2 * 8000);
  CHECK(train.clip_frames(row) == 1 + 2 * 8000 / 64);
  CHECK(train.clips.clip_flags[row] == 0);
  const std::vector<float> clip = train.clip(row);
  CHECK(*std::max_element(clip.begin(), clip.end()) > -100.0f);
}

}  // namespace melforge_test_split_by_class
