// melforge_data's views (data/views/, issue 28): tiles against a brute-force reference and as a covering of every
// clip, crops determined by (seed, epoch, clip) alone (resume, clip order and threads change nothing; epochs and seeds
// do), whole clips and their length batches, masks that never count padding as real, and the options refused by
// flag before any work.
#include <catch2/catch.hpp>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "melforge/common/errors.h"
#include "views/clips.h"
#include "views/crops.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge_test_views {

using namespace melforge;
using namespace melforge::data::views;
namespace po = boost::program_options;

namespace {

/// 100 frames per second: a duration of k hundredths of a second is k frames.
constexpr FrameRate kRate{.sample_rate = 16000, .hop_length = 160};
/// Tile and crop length of the tests, frames (0.08 s).
constexpr int64_t kT = 8;

/// Options for `view` with tiles and crops of kT frames.
ViewOptions options_for(const std::string& view) {
  ViewOptions o;
  o.view = view;
  o.tile_seconds = 0.08;
  o.crop_seconds = 0.08;
  return o;
}

/// Clip lengths around the window length, and long ones.
std::vector<int64_t> awkward_lengths() { return {1, kT - 1, kT, kT + 1, 2 * kT - 1, 2 * kT, 2 * kT + 1, 29, 1000}; }

/// The tiles of one clip by brute force: every start 0, hop, 2 hop, ... that is needed to reach the clip's end
/// (the previous tile ends before it), kept when it is the first or holds at least min_real of a tile.
std::vector<Example> reference_tiles(int64_t clip, int64_t frames, int64_t tile, int64_t hop, double min_real) {
  std::vector<Example> out;
  for (int64_t s = 0; s < frames; s += hop) {
    if (s > 0 && s - hop + tile >= frames) break;
    const int64_t real = std::min(tile, frames - s);
    if (s == 0 || static_cast<double>(real) / static_cast<double>(tile) >= min_real)
      out.push_back({.clip = clip, .start = s, .length = tile, .real = real, .clip_frames = frames});
  }
  return out;
}

/// How many examples read each frame of a clip of `frames` frames, through source_frames and frame_mask; checks that
/// positions are real exactly when the mask says so.
std::vector<int> coverage(const std::vector<Example>& examples, int64_t frames) {
  std::vector<int> hits(static_cast<std::size_t>(frames), 0);
  for (const Example& e : examples) {
    const auto source = source_frames(e);
    const auto mask = frame_mask(e);
    REQUIRE(static_cast<int64_t>(source.size()) == e.length);
    REQUIRE(static_cast<int64_t>(mask.size()) == e.length);
    CHECK(std::count(mask.begin(), mask.end(), uint8_t{1}) == e.real);
    for (std::size_t i = 0; i < source.size(); ++i) {
      CHECK((mask[i] == 1) == (source[i] >= 0));
      if (source[i] < 0) continue;
      REQUIRE(source[i] < frames);
      ++hits[static_cast<std::size_t>(source[i])];
    }
  }
  return hits;
}

/// The InvalidArgument message of `f()`, or a marker when it throws none.
template <typename F>
std::string invalid_argument(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no InvalidArgument>";
}

}  // namespace

TEST_CASE("frames(seconds) rounds to the nearest frame, halves away from zero", "[views]") {
  CHECK(kRate.frames(2.0) == 200);
  CHECK(kRate.frames(0.1) == 10);
  CHECK(kRate.frames(0.3) == 30);
  CHECK(kRate.frames(0.015) == 2);
  CHECK(kRate.frames(0.0149) == 1);
  CHECK(kRate.frames(0.004) == 0);
  CHECK(FrameRate{.sample_rate = 22050, .hop_length = 512}.frames(3.0) == 129);
}

TEST_CASE("tiles equal a brute-force tiling, cover every clip and mask their padding", "[views]") {
  const int64_t frames = GENERATE(from_range(awkward_lengths()));
  const int64_t hop = GENERATE(as<int64_t>{}, kT, kT / 2, 3, 1);
  const double min_real = GENERATE(0.0, 0.5, 1.0);
  ViewOptions o = options_for("tiles");
  o.tile_hop = static_cast<double>(hop) / 100;
  o.min_real = min_real;
  const auto view = make_view(o, kRate);
  CAPTURE(frames, hop, min_real);
  const int64_t counts[] = {frames};
  const auto tiles = view->examples(counts, 0, 0);
  CHECK(tiles == reference_tiles(0, frames, kT, hop, min_real));
  REQUIRE(!tiles.empty());
  if (frames <= kT) CHECK(tiles.size() == 1);
  for (const Example& e : tiles) {
    CHECK(e.length == kT);
    CHECK(!e.repeat);
    CHECK(e.real == std::min(kT, frames - e.start));
    if (tiles.size() > 1) CHECK(static_cast<double>(e.real) / kT >= min_real);
  }
  const auto hits = coverage(tiles, frames);
  const auto first_unread = std::find(hits.begin(), hits.end(), 0);
  const auto unread_tail = hits.end() - first_unread;
  CHECK(std::all_of(first_unread, hits.end(), [](int h) { return h == 0; }));
  if (min_real == 0.0)
    CHECK(unread_tail == 0);
  else
    CHECK(static_cast<double>(unread_tail) < min_real * kT);
}

TEST_CASE("tiles of a split come clip by clip and never depend on the epoch or seed", "[views]") {
  const auto view = make_view(options_for("tiles"), kRate);
  const auto lengths = awkward_lengths();
  const auto tiles = view->examples(lengths, 0, 0);
  std::vector<Example> expected;
  for (std::size_t c = 0; c < lengths.size(); ++c) {
    const auto one = reference_tiles(static_cast<int64_t>(c), lengths[c], kT, kT, 0.5);
    expected.insert(expected.end(), one.begin(), one.end());
  }
  CHECK(tiles == expected);
  CHECK(view->examples(lengths, 99, 7) == tiles);
  CHECK(!view->varies_by_epoch());
}

TEST_CASE("a crop lies in its clip, or pads or repeats a short clip", "[views]") {
  const int64_t frames = GENERATE(from_range(awkward_lengths()));
  const uint64_t seed = GENERATE(uint64_t{0}, uint64_t{1}, uint64_t{0x8000000000000005ULL});
  const auto short_clips = GENERATE(ShortClips::pad, ShortClips::repeat);
  ViewOptions o = options_for("crops");
  o.short_clips = short_clips;
  const auto view = make_view(o, kRate);
  CAPTURE(frames, seed, short_clips);
  const int64_t counts[] = {frames};
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    const auto crops = view->examples(counts, seed, epoch);
    REQUIRE(crops.size() == 1);
    const Example& e = crops[0];
    CHECK(e.length == kT);
    CHECK(e.start >= 0);
    CHECK(e.start + (e.repeat ? 0 : e.real) <= frames);
    const auto source = source_frames(e);
    if (frames >= kT) {
      CHECK((e.real == kT && !e.repeat));
    } else if (short_clips == ShortClips::pad) {
      CHECK((e.start == 0 && e.real == frames && !e.repeat));
    } else {
      CHECK((e.start == 0 && e.real == kT && e.repeat));
      for (int64_t i = 0; i < kT; ++i) CHECK(source[static_cast<std::size_t>(i)] == i % frames);
    }
    const auto hits = coverage(crops, frames);
    CHECK(std::accumulate(hits.begin(), hits.end(), int64_t{0}) == e.real);
  }
}

TEST_CASE("crops: same seed and epoch give the same crops, other epochs and seeds other crops", "[views]") {
  const std::vector<int64_t> lengths(64, 3 * kT);
  const auto view = make_view(options_for("crops"), kRate);
  const auto again = make_view(options_for("crops"), kRate);
  CHECK(view->varies_by_epoch());
  std::set<std::vector<int64_t>> seen;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const auto crops = view->examples(lengths, 11, epoch);
    CHECK(again->examples(lengths, 11, epoch) == crops);
    std::vector<int64_t> starts;
    for (const Example& e : crops) starts.push_back(e.start);
    seen.insert(starts);
    CHECK(starts != [&] {
      std::vector<int64_t> other;
      for (const Example& e : view->examples(lengths, 12, epoch)) other.push_back(e.start);
      return other;
    }());
  }
  CHECK(seen.size() == 6);
}

TEST_CASE("crop starts are uniform over [0, frames - crop]", "[views]") {
  const int64_t frames = kT + 3;
  std::map<int64_t, int> counts;
  for (int64_t epoch = 0; epoch < 4000; ++epoch) ++counts[crop_example(5, frames, kT, ShortClips::pad, 3, epoch).start];
  REQUIRE(counts.size() == 4);
  for (const auto& [start, n] : counts) {
    CAPTURE(start);
    CHECK(start >= 0);
    CHECK(start <= frames - kT);
    CHECK(n > 850);
    CHECK(n < 1150);
  }
}

TEST_CASE("crops do not depend on the order or the threads that plan the clips", "[views]") {
  std::vector<int64_t> lengths;
  for (int64_t c = 0; c < 400; ++c) lengths.push_back(1 + (c * 37) % 200);
  const auto view = make_view(options_for("crops"), kRate);
  const auto whole = view->examples(lengths, 5, 3);
  REQUIRE(whole.size() == lengths.size());
  std::vector<Example> backwards(lengths.size());
  for (auto c = static_cast<int64_t>(lengths.size()) - 1; c >= 0; --c) {
    std::vector<Example> one;
    view->clip_examples(c, lengths[static_cast<std::size_t>(c)], 5, 3, one);
    backwards[static_cast<std::size_t>(c)] = one.at(0);
  }
  CHECK(backwards == whole);
  std::vector<Example> threaded(lengths.size());
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (auto c = static_cast<std::size_t>(t); c < lengths.size(); c += 4) {
        std::vector<Example> one;
        view->clip_examples(static_cast<int64_t>(c), lengths[c], 5, 3, one);
        threaded[c] = one.at(0);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(threaded == whole);
}

TEST_CASE("crops of epoch e are the same fresh or after epochs 0..e-1 (exact resume)", "[views]") {
  const std::vector<int64_t> lengths = awkward_lengths();
  const int64_t resume_epoch = GENERATE(0, 1, 4);
  const auto run = make_view(options_for("crops"), kRate);
  std::vector<Example> uninterrupted;
  for (int64_t epoch = 0; epoch <= resume_epoch; ++epoch) uninterrupted = run->examples(lengths, 21, epoch);
  const auto resumed = make_view(options_for("crops"), kRate);
  CHECK(resumed->examples(lengths, 21, resume_epoch) == uninterrupted);
}

TEST_CASE("clips are whole clips, and their batches hold each once, by length, under the budget", "[views]") {
  const auto view = make_view(options_for("clips"), kRate);
  std::vector<int64_t> lengths;
  for (int64_t c = 0; c < 300; ++c) lengths.push_back(1 + (c * 7919) % 450);
  lengths.push_back(5000);
  const auto clips = view->examples(lengths, 0, 0);
  REQUIRE(clips.size() == lengths.size());
  for (std::size_t c = 0; c < clips.size(); ++c)
    CHECK(clips[c] == Example{.clip = static_cast<int64_t>(c), .start = 0, .length = lengths[c], .real = lengths[c],
                              .clip_frames = lengths[c]});
  const int64_t budget = GENERATE(int64_t{1}, int64_t{449}, int64_t{2000}, int64_t{100000});
  CAPTURE(budget);
  const auto batches = batch_by_length(clips, budget);
  CHECK(batches == batch_by_length(clips, budget));
  std::vector<int> seen(clips.size(), 0);
  int64_t previous = 0;
  for (const ClipBatch& b : batches) {
    REQUIRE(!b.members.empty());
    int64_t longest = 0;
    for (const int64_t i : b.members) {
      ++seen[static_cast<std::size_t>(i)];
      const int64_t length = clips[static_cast<std::size_t>(i)].length;
      CHECK(length >= previous);
      previous = length;
      longest = std::max(longest, length);
      const auto mask = frame_mask(clips[static_cast<std::size_t>(i)], b.length);
      CHECK(static_cast<int64_t>(mask.size()) == b.length);
      CHECK(std::count(mask.begin(), mask.end(), uint8_t{1}) == length);
    }
    CHECK(b.length == longest);
    CHECK((b.members.size() == 1 || static_cast<int64_t>(b.members.size()) * b.length <= budget));
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST_CASE("clip batches of a small example, by hand", "[views]") {
  std::vector<Example> clips;
  for (const int64_t n : {5, 3, 10, 3, 20}) clips.push_back({.length = n, .real = n, .clip_frames = n});
  const auto batches = batch_by_length(clips, 12);
  REQUIRE(batches.size() == 4);
  CHECK(batches[0] == ClipBatch{{1, 3}, 3});
  CHECK(batches[1] == ClipBatch{{0}, 5});
  CHECK(batches[2] == ClipBatch{{2}, 10});
  CHECK(batches[3] == ClipBatch{{4}, 20});
  CHECK(batch_by_length(std::span<const Example>{}, 12).empty());
  CHECK_THROWS_AS(batch_by_length(clips, 0), InvalidArgument);
}

TEST_CASE("view options: bad values are refused with the flag named, before any view is made", "[views]") {
  using Mutate = void (*)(ViewOptions&);
  const auto row = GENERATE(table<Mutate, std::string>({
      {[](ViewOptions& o) { o.view = "tile"; }, "--view: 'tile' is not one of tiles, crops, clips"},
      {[](ViewOptions& o) { o.tile_seconds = 0; }, "--tile-seconds"},
      {[](ViewOptions& o) { o.tile_seconds = -1; }, "--tile-seconds"},
      {[](ViewOptions& o) { o.tile_seconds = std::numeric_limits<double>::infinity(); }, "--tile-seconds"},
      {[](ViewOptions& o) { o.tile_seconds = std::nan(""); }, "--tile-seconds"},
      {[](ViewOptions& o) { o.tile_seconds = 0.001; }, "--tile-seconds 0.001 is less than one frame"},
      {[](ViewOptions& o) { o.tile_seconds = 1e9; }, "--tile-seconds 1e+09 is 2^31 frames or more"},
      {[](ViewOptions& o) { o.tile_hop = -0.5; }, "--tile-hop"},
      {[](ViewOptions& o) { o.tile_hop = 3; }, "--tile-hop 3 exceeds --tile-seconds 2"},
      {[](ViewOptions& o) { o.tile_hop = 0.001; }, "--tile-hop 0.001 is less than one frame"},
      {[](ViewOptions& o) { o.min_real = -0.1; }, "--min-real"},
      {[](ViewOptions& o) { o.min_real = 1.5; }, "--min-real"},
      {[](ViewOptions& o) { o.min_real = std::nan(""); }, "--min-real"},
      {[](ViewOptions& o) { o.crop_seconds = 0; }, "--crop-seconds"},
      {[](ViewOptions& o) { o.crop_seconds = 0.002; }, "--crop-seconds"},
      {[](ViewOptions& o) { o.clip_batch_seconds = -3; }, "--clip-batch-seconds"},
  }));
  ViewOptions o;
  CHECK_NOTHROW(o.validate(kRate));
  std::get<0>(row)(o);
  CAPTURE(std::get<1>(row));
  CHECK_THAT(invalid_argument([&] { make_view(o, kRate); }), Catch::StartsWith(std::get<1>(row)));
}

TEST_CASE("view options: the flags are registered dashed, and an unknown view or short-clips value is refused",
          "[views]") {
  ViewOptions o;
  po::options_description desc;
  add_options(desc, o);
  const char* argv[] = {"prog",       "--view",     "crops",       "--tile-seconds", "3",   "--tile-hop",
                        "1.5",        "--min-real", "0.25",        "--crop-seconds", "1.5", "--short-clips",
                        "repeat",     "--clip-batch-seconds",      "60"};
  po::variables_map vm;
  po::store(po::parse_command_line(static_cast<int>(std::size(argv)), argv, desc), vm);
  po::notify(vm);
  CHECK(o.view == "crops");
  CHECK(o.tile_seconds == 3);
  CHECK(o.tile_hop == 1.5);
  CHECK(o.min_real == 0.25);
  CHECK(o.crop_seconds == 1.5);
  CHECK(o.short_clips == ShortClips::repeat);
  CHECK(o.clip_batch_seconds == 60);
  CHECK_NOTHROW(o.validate(kRate));
  CHECK(view_names() == "tiles, crops, clips");
  CHECK(make_view(o, kRate)->name() == "crops");
  CHECK_THROWS_WITH(parse_short_clips("loop"), "--short-clips: 'loop' is not one of pad, repeat");
  CHECK(ViewOptions{}.hop_seconds() == 2.0);
}

TEST_CASE("a view refuses a clip without frames, naming it, and a negative epoch", "[views]") {
  const auto view = make_view(options_for("tiles"), kRate);
  const std::vector<int64_t> lengths = {10, 0, 4};
  CHECK_THAT(invalid_argument([&] { view->examples(lengths, 0, 0); }), Catch::StartsWith("clip 1 has 0 frames"));
  CHECK_THAT(invalid_argument([&] { view->examples(std::vector<int64_t>{3}, 0, -1); }), Catch::Contains("epoch"));
  CHECK_THAT(invalid_argument([&] { make_view(ViewOptions{}, FrameRate{.sample_rate = 16000, .hop_length = 0}); }),
             Catch::Contains("hop length"));
}

}  // namespace melforge_test_views
