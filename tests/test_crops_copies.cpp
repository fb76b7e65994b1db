// Crops of a split with build-time augmented copies (issue 32): the reader's groups of copies from `aug_copy` (a clean
// row and the augmented rows after it), hostile `aug_copy` values refused naming the file and the field, and the
// crops view's one crop per group per epoch, drawn from (seed, epoch, group) alone: the clean row with probability
// 1 - aug_prob, else an augmented copy uniformly (exact counter-based draws over 20,000 groups, held to 5 sigma),
// deterministic and resume-exact, and exactly today's crops for groups of one row.
#include <catch2/catch.hpp>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "clip_fixture.h"
#include "loader/example_loader.h"
#include "melforge/common/errors.h"
#include "reader/split_info.h"
#include "test_util.h"
#include "views/crops.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge_test_crops_copies {

using namespace melforge;
using namespace melforge::data::views;
namespace fs = std::filesystem;

namespace {

/// 100 frames per second.
constexpr FrameRate kRate{.sample_rate = 16000, .hop_length = 160};
/// Crop length of the tests, frames.
constexpr int64_t kCrop = 8;

/// The crops view of kCrop frames with `aug_prob`.
std::unique_ptr<View> crops_view(double aug_prob) {
  ViewOptions o;
  o.view = "crops";
  o.crop_seconds = 0.08;
  o.aug_prob = aug_prob;
  return make_view(o, kRate);
}

/// Gives the split file at `path` the dataset `aug_copy` (int32, `values`) and paths on which every row with a
/// value above 0 has the path of the row before it, as melforge-build writes a file's copies.
void add_aug_copy(const fs::path& path, const std::vector<int64_t>& values, int64_t files) {
  std::vector<std::string> paths;
  for (int64_t f = 0; f < files; ++f)
    paths.push_back(f > 0 && f < static_cast<int64_t>(values.size()) && values[static_cast<std::size_t>(f)] > 0
                        ? paths.back()
                        : "spk" + std::to_string(f % 3) + "/utt" + std::to_string(f) + ".wav");
  auto file = h5::open_file(path, true);
  if (H5Ldelete(file.id(), "path", H5P_DEFAULT) < 0) throw IoError("cannot delete path");
  h5::write_strings(file, "path", paths);
  test::write_int_dataset(file, "aug_copy", H5T_STD_I32LE, values);
}

/// Frames of `groups` groups of `copies` + 1 rows, lengths 8 to 57 frames (some exactly the crop, none shorter).
std::vector<int64_t> group_frames(int64_t groups, int64_t copies) {
  std::vector<int64_t> frames;
  for (int64_t r = 0; r < groups * (copies + 1); ++r) frames.push_back(kCrop + (r * 37) % 50);
  return frames;
}

/// Offsets of `groups` groups of `copies` + 1 rows.
std::vector<int64_t> even_offsets(int64_t groups, int64_t copies) {
  std::vector<int64_t> offsets;
  for (int64_t g = 0; g <= groups; ++g) offsets.push_back(g * (copies + 1));
  return offsets;
}

}  // namespace

TEST_CASE("crops: the groups of copies are read from aug_copy, every row its own group without it", "[crops]") {
  const auto row = GENERATE(table<std::vector<int64_t>, std::vector<int64_t>>({
      {{0, 1, 2, 0, 0, 1, 0}, {0, 3, 4, 6, 7}},
      {{0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 4, 5, 6, 7}},
      {{0, 2, 5, 0, 64, 0, 1}, {0, 3, 5, 7}},
      {{}, {0, 1, 2, 3, 4, 5, 6, 7}},
  }));
  const auto& [copies, offsets] = row;
  test::TempDir dir;
  const std::vector<int64_t> frames = {20, 9, 31, 12, 8, 40, 15};
  test::write_clip_split(dir / "train.h5", {.clip_frames = frames});
  if (!copies.empty()) add_aug_copy(dir / "train.h5", copies, 7);
  const data::SplitInfo s = data::read_split_info(dir / "train.h5", "train");
  CHECK(std::vector<int64_t>(s.aug_copy.begin(), s.aug_copy.end()) == copies);
  CHECK(s.group_offsets() == offsets);
  for (const double p : {0.0, 0.6, 1.0}) {
    const std::vector<Example> ex = crops_view(p)->examples(s.clip_frame_counts(), 3, 1, s.group_offsets());
    REQUIRE(ex.size() == offsets.size() - 1);
    for (std::size_t g = 0; g < ex.size(); ++g) {
      CHECK(ex[g].clip >= offsets[g]);
      CHECK(ex[g].clip < offsets[g + 1]);
      if (p == 0.0) CHECK(ex[g].clip == offsets[g]);
      if (p == 1.0 && offsets[g + 1] - offsets[g] > 1) CHECK(ex[g].clip > offsets[g]);
    }
  }
  const std::string summary = copies == std::vector<int64_t>{0, 1, 2, 0, 0, 1, 0}    ? "4 utterances, 0 to 2"
                              : copies == std::vector<int64_t>{0, 2, 5, 0, 64, 0, 1} ? "3 utterances, 1 to 2"
                                                                                    : "7 utterances, 0";
  CHECK(crops_summary(s.group_offsets(), 0.6) == "crops: " + summary + " copies each, aug-prob 0.6");
}

TEST_CASE("crops: hostile aug_copy values are refused naming the file, the field and the row", "[crops]") {
  using Mutate = std::function<void(const fs::path&)>;
  const auto row = GENERATE(table<std::string, Mutate, std::vector<std::string>>({
      {"above 64", [](const fs::path& p) { add_aug_copy(p, {0, 1, 65, 0}, 4); }, {"aug_copy[2] = 65", "[0, 64]"}},
      {"negative", [](const fs::path& p) { add_aug_copy(p, {0, -1, 0, 0}, 4); }, {"aug_copy[1] = -1"}},
      {"huge",
       [](const fs::path& p) {
         add_aug_copy(p, {0, 0, 0, 0}, 4);
         test::replace_int_dataset(p, "aug_copy", H5T_STD_I64LE, {0, 0, 0, int64_t{1} << 40});
       },
       {"aug_copy[3] = 1099511627776"}},
      {"a copy first", [](const fs::path& p) { add_aug_copy(p, {1, 0, 0, 0}, 4); }, {"aug_copy[0] = 1", "first row"}},
      {"copies out of order", [](const fs::path& p) { add_aug_copy(p, {0, 2, 1, 0}, 4); },
       {"aug_copy[2] = 1", "aug_copy[1] = 2"}},
      {"a copy repeated", [](const fs::path& p) { add_aug_copy(p, {0, 1, 1, 0}, 4); }, {"aug_copy[2] = 1"}},
      {"a copy on another path",
       [](const fs::path& p) {
         add_aug_copy(p, {0, 1, 0, 0}, 4);
         auto f = h5::open_file(p, true);
         H5Ldelete(f.id(), "path", H5P_DEFAULT);
         h5::write_strings(f, "path", {"a.wav", "b.wav", "c.wav", "d.wav"});
       },
       {"aug_copy[1] = 1", "copy of row 0", "b.wav"}},
      {"too short", [](const fs::path& p) { add_aug_copy(p, {0, 1, 0}, 4); }, {"aug_copy has shape [3]", "[4]"}},
      {"floats",
       [](const fs::path& p) {
         add_aug_copy(p, {0, 0, 0, 0}, 4);
         test::replace_int_dataset(p, "aug_copy", H5T_IEEE_F64LE, {0, 1, 0, 0});
       },
       {"aug_copy is not an integer dataset"}},
  }));
  const auto& [what, mutate, expected] = row;
  CAPTURE(what);
  test::TempDir dir;
  test::write_clip_split(dir / "train.h5", {.clip_frames = {10, 11, 12, 13}});
  mutate(dir / "train.h5");
  try {
    data::read_split_info(dir / "train.h5", "train");
    FAIL("not refused: " + what);
  } catch (const FormatError& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(message.find((dir / "train.h5").string()) != std::string::npos);
    CHECK(message.find("aug_copy") != std::string::npos);
    for (const std::string& part : expected) CHECK(message.find(part) != std::string::npos);
  }
}

TEST_CASE("crops: one row per group per epoch, clean with probability 1 - P, each copy uniform (5 sigma)",
          "[crops]") {
  const double p = GENERATE(0.0, 0.2, 0.6, 1.0);
  const int64_t copies = GENERATE(int64_t{1}, int64_t{2}, int64_t{5});
  const uint64_t seed = GENERATE(uint64_t{0}, uint64_t{7}, uint64_t{123456789});
  const int64_t epoch = GENERATE(int64_t{0}, int64_t{3});
  CAPTURE(p, copies, seed, epoch);
  constexpr int64_t kGroups = 20000;
  const std::vector<int64_t> frames = group_frames(kGroups, copies), offsets = even_offsets(kGroups, copies);
  const std::vector<Example> ex = crops_view(p)->examples(frames, seed, epoch, offsets);
  REQUIRE(static_cast<int64_t>(ex.size()) == kGroups);
  std::vector<int64_t> picked(static_cast<std::size_t>(copies + 1), 0);
  for (int64_t g = 0; g < kGroups; ++g) {
    const Example& e = ex[static_cast<std::size_t>(g)];
    const int64_t k = e.clip - offsets[static_cast<std::size_t>(g)];
    REQUIRE(k >= 0);
    REQUIRE(k <= copies);
    ++picked[static_cast<std::size_t>(k)];
    REQUIRE(e == crop_example(e.clip, frames[static_cast<std::size_t>(e.clip)], kCrop, ShortClips::pad, seed, epoch));
  }
  const double n = kGroups, augmented = n - static_cast<double>(picked[0]);
  if (p == 0.0 || p == 1.0) {
    CHECK(augmented == n * p);
  } else {
    CHECK(std::abs(augmented - n * p) <= 5.0 * std::sqrt(n * p * (1 - p)));
  }
  const double q = 1.0 / static_cast<double>(copies);
  for (int64_t k = 1; k <= copies; ++k)
    CHECK(std::abs(static_cast<double>(picked[static_cast<std::size_t>(k)]) - augmented * q) <=
          5.0 * std::sqrt(augmented * q * (1 - q)) + 1e-9);
}

TEST_CASE("crops: the draws are a function of (seed, epoch, group): deterministic, resume-exact, new each epoch",
          "[crops]") {
  const double p = GENERATE(0.3, 0.6);
  const int64_t copies = GENERATE(int64_t{1}, int64_t{4});
  const uint64_t seed = GENERATE(uint64_t{1}, uint64_t{99});
  constexpr int64_t kGroups = 500;
  const std::vector<int64_t> frames = group_frames(kGroups, copies), offsets = even_offsets(kGroups, copies);
  const auto view = crops_view(p);
  std::vector<std::vector<Example>> epochs;
  for (int64_t e = 0; e < 4; ++e) epochs.push_back(view->examples(frames, seed, e, offsets));
  const auto fresh = crops_view(p);
  CHECK(fresh->examples(frames, seed, 3, offsets) == epochs[3]);
  CHECK(view->examples(frames, seed, 1, offsets) == epochs[1]);
  for (int64_t g = kGroups - 1; g >= 0; --g) {
    const auto first = static_cast<std::size_t>(offsets[static_cast<std::size_t>(g)]);
    const std::span<const int64_t> rows(frames.data() + first, static_cast<std::size_t>(copies + 1));
    REQUIRE(group_crop(static_cast<int64_t>(first), rows, kCrop, ShortClips::pad, p, seed, 2) ==
            epochs[2][static_cast<std::size_t>(g)]);
  }
  int64_t other_row = 0, other_start = 0;
  for (std::size_t g = 0; g < kGroups; ++g) {
    other_row += epochs[0][g].clip != epochs[1][g].clip;
    other_start += epochs[0][g].start != epochs[1][g].start;
  }
  CHECK(other_row > kGroups / 10);
  CHECK(other_start > kGroups / 2);
  CHECK(crops_view(p)->examples(frames, seed + 1, 0, offsets) != epochs[0]);
}

TEST_CASE("crops: without copies, or with groups of one row, exactly today's crops", "[crops]") {
  const double p = GENERATE(0.0, 0.6, 1.0);
  const uint64_t seed = GENERATE(uint64_t{0}, uint64_t{5});
  const std::vector<int64_t> frames = group_frames(300, 0);
  std::vector<int64_t> singles(frames.size() + 1);
  std::iota(singles.begin(), singles.end(), 0);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<Example> today = crops_view(0.6)->examples(frames, seed, epoch);
    CHECK(crops_view(p)->examples(frames, seed, epoch, singles) == today);
    CHECK(crops_view(p)->examples(frames, seed, epoch) == today);
    for (std::size_t c = 0; c < frames.size(); ++c)
      REQUIRE(today[c] == crop_example(static_cast<int64_t>(c), frames[c], kCrop, ShortClips::pad, seed, epoch));
  }
}

TEST_CASE("crops: tiles and clips still read every copy, and bad group offsets are refused", "[crops]") {
  const std::vector<int64_t> frames = {20, 9, 31, 12, 8}, offsets = {0, 3, 5};
  for (const std::string name : {"tiles", "clips"}) {
    ViewOptions o;
    o.view = name;
    o.tile_seconds = 0.08;
    const auto view = make_view(o, kRate);
    CHECK(view->examples(frames, 1, 0, offsets) == view->examples(frames, 1, 0));
  }
  const auto view = crops_view(0.5);
  for (const std::vector<int64_t>& bad :
       std::vector<std::vector<int64_t>>{{1, 3, 5}, {0, 3, 4}, {0, 3, 3, 5}, {0, 6}, {0}})
    CHECK_THROWS_AS(view->examples(frames, 1, 0, bad), InvalidArgument);
  CHECK_THROWS_AS(group_copy(-1, 0.5, 0, 0, 0), InvalidArgument);
  CHECK_THROWS_AS(group_copy(2, 1.5, 0, 0, 0), InvalidArgument);
  CHECK(group_copy(0, 1.0, 0, 0, 0) == 0);
}

TEST_CASE("crops: --aug-prob is registered and refused outside [0, 1], naming the flag", "[crops]") {
  const double bad = GENERATE(-0.1, 1.5, std::numeric_limits<double>::quiet_NaN(),
                              std::numeric_limits<double>::infinity());
  ViewOptions o;
  o.aug_prob = bad;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("--aug-prob"));
  ViewOptions parsed;
  boost::program_options::options_description desc;
  add_options(desc, parsed);
  const char* argv[] = {"x", "--aug-prob", "0.25"};
  boost::program_options::variables_map vm;
  boost::program_options::store(boost::program_options::parse_command_line(3, argv, desc), vm);
  boost::program_options::notify(vm);
  CHECK(parsed.aug_prob == 0.25);
  CHECK(ViewOptions{}.aug_prob == 0.6);
}

TEST_CASE("crops: the loader gives one example per group each epoch, the same fresh or resumed", "[crops]") {
  const double p = GENERATE(0.0, 0.6);
  test::TempDir dir;
  const std::vector<int64_t> frames = {20, 19, 31, 12, 18, 40, 15, 22, 9, 30};
  test::write_clip_split(dir / "train.h5", {.clip_frames = frames, .chunk_rows = 7});
  add_aug_copy(dir / "train.h5", {0, 1, 2, 0, 1, 2, 0, 0, 1, 2}, 10);
  const data::SplitInfo s = data::read_split_info(dir / "train.h5", "train");
  const std::vector<int64_t> offsets = {0, 3, 6, 7, 10};
  REQUIRE(s.group_offsets() == offsets);
  data::LoaderOptions o;
  o.batch_size = 3;
  o.prefetch = 0;
  o.seed = 4;
  std::shared_ptr<const View> view = crops_view(p);
  data::ExampleLoader loader(s, view, 11, o, -100.0f);
  std::vector<std::vector<int64_t>> by_epoch;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader.start_epoch(epoch);
    CHECK(loader.size() == 4);
    std::vector<int64_t> seen(4, 0), rows;
    while (const auto b = loader.next())
      for (int64_t i = 0; i < b->size; ++i) {
        const int64_t clip = b->clip[static_cast<std::size_t>(i)];
        rows.push_back(clip);
        ++seen[static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), clip) - offsets.begin() - 1)];
        if (p == 0.0) CHECK(s.aug_copy[static_cast<std::size_t>(clip)] == 0);
      }
    CHECK(seen == std::vector<int64_t>(4, 1));
    by_epoch.push_back(rows);
  }
  data::ExampleLoader resumed(s, view, 11, o, -100.0f);
  resumed.start_epoch(2);
  std::vector<int64_t> again;
  while (const auto b = resumed.next()) again.insert(again.end(), b->clip.begin(), b->clip.end());
  CHECK(again == by_epoch[2]);
}

}  // namespace melforge_test_crops_copies
