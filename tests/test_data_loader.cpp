// melforge_data (data/): SplitInfo and MelReader against the file as melforge::h5 reads it, and ExampleLoader's
// epochs: on the committed schema 1/2 datasets (tests/data/legacy) through their tiles (every valid segment once,
// the planned order, determinism in (seed, epoch) across prefetch depths, drop_last, each chunk inflated once per
// shuffled epoch); on schema 3 files written in the test through tiles, crops and whole clips by length (every row
// against a naive gather of the written frames, lengths, padding, targets, crops by epoch).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "clip_fixture.h"
#include "loader/example_loader.h"
#include "melforge/common/errors.h"
#include "reader/mel_reader.h"
#include "reader/split_info.h"
#include "test_util.h"
#include "views/clips.h"
#include "views/gather.h"
#include "views/split_view.h"

namespace melforge_test_data_loader {

using namespace melforge;

namespace {

/// The committed legacy dataset of `dtype`: schema 1 (float16) or schema 2 (float32), 2 files per chunk.
std::filesystem::path legacy(mel::DType dtype) { return test::legacy_dataset(dtype == mel::DType::float16 ? 1 : 2); }

/// What a schema 1/2 split file holds, read through melforge::h5 (mel as float32).
struct LegacySplit {
  std::vector<float> mel;
  std::vector<int32_t> label;
  std::vector<int32_t> valid;
  std::vector<std::string> path;
  std::vector<std::string> classes;
};

LegacySplit read_legacy(const std::filesystem::path& file) {
  auto f = h5::open_file(file);
  return {h5::read_float(h5::open_dataset(f, "mel")), h5::read_int32(f, "label"), h5::read_int32(f, "num_valid_long"),
          h5::read_strings(f, "path"), h5::read_strings(f, "class_names")};
}

/// The float32 [n_mels, n_frames] spectrogram of valid segment `position`, from the reference read.
std::vector<float> reference_segment(const LegacySplit& ref, const data::SplitInfo& info, int64_t position) {
  const data::SegmentRef r = data::segment_at(info.segment_offsets(), info.info.num_short, position);
  const int64_t per = info.info.n_mels * info.info.n_frames;
  const int64_t row = (r.file * info.info.num_long + r.long_index) * info.info.num_short + r.short_index;
  return {ref.mel.begin() + row * per, ref.mel.begin() + (row + 1) * per};
}

/// Every batch of `epoch`, concatenated: x (rows of each batch's length), lengths, y, clip.
struct Epoch {
  std::vector<float> x;
  std::vector<int64_t> lengths, y, file, batch_length;
  int64_t batches = 0;
};

Epoch run_epoch(data::ExampleLoader& loader, int64_t epoch) {
  Epoch e;
  loader.start_epoch(epoch);
  while (auto b = loader.next()) {
    const int64_t per = loader.split().info.n_mels * b->length;
    e.x.insert(e.x.end(), b->x.begin(), b->x.begin() + b->size * per);
    e.lengths.insert(e.lengths.end(), b->lengths.begin(), b->lengths.begin() + b->size);
    e.y.insert(e.y.end(), b->y.begin(), b->y.begin() + b->size);
    e.file.insert(e.file.end(), b->clip.begin(), b->clip.begin() + b->size);
    e.batch_length.insert(e.batch_length.end(), static_cast<std::size_t>(b->size), b->length);
    CHECK(b->index == e.batches);
    ++e.batches;
  }
  return e;
}

/// An ExampleLoader of `info` through its default view (schema 1/2: its segments) with options `o`.
data::ExampleLoader segment_loader(const data::SplitInfo& info, const data::LoaderOptions& o) {
  std::shared_ptr<const data::views::View> view = data::views::make_split_view(info, {}, true, false);
  return data::ExampleLoader(info, view, 0, o, data::views::pad_value(info));
}

}  // namespace

TEST_CASE("SplitInfo and MelReader read what the file holds", "[data]") {
  const auto dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  const auto out = legacy(dtype);
  const auto info = data::read_split_info(data::split_file(out, "train"), "train");
  const auto ref = read_legacy(out / "train.h5");
  REQUIRE(info.files() == static_cast<int64_t>(ref.path.size()));
  REQUIRE(info.files() > 4);
  CHECK(info.paths == ref.path);
  CHECK(info.class_names == ref.classes);
  CHECK(info.info.dtype == (dtype == mel::DType::float16 ? "float16" : "float32"));
  int64_t valid = 0;
  for (int64_t f = 0; f < info.files(); ++f) {
    CHECK(info.labels[static_cast<size_t>(f)] == ref.label[static_cast<size_t>(f)]);
    CHECK(info.num_valid_long[static_cast<size_t>(f)] == ref.valid[static_cast<size_t>(f)]);
    valid += ref.valid[static_cast<size_t>(f)] * info.info.num_short;
  }
  CHECK(info.valid_segments() == valid);
  data::MelReader reader(info.path, 0);
  CHECK(reader.files_per_chunk() == 2);
  std::vector<float> seg(static_cast<size_t>(info.info.n_mels * info.info.n_frames));
  for (int64_t p = 0; p < valid; p += 5) {
    const auto r = data::segment_at(info.segment_offsets(), info.info.num_short, p);
    reader.read_segment(r.file, r.long_index, r.short_index, seg.data());
    CHECK(seg == reference_segment(ref, info, p));
  }
  CHECK_THROWS_AS(reader.read_segment(info.files(), 0, 0, seg.data()), InvalidArgument);
}

TEST_CASE("split_file names the missing folder or file", "[data]") {
  test::TempDir d;
  try {
    data::split_file(d / "nope", "train");
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find((d / "nope").string()) != std::string::npos);
  }
  std::filesystem::create_directories(d / "empty");
  CHECK_THROWS_AS(data::split_file(d / "empty", "val"), IoError);
  CHECK_THROWS_AS(data::split_file(d / "empty", "dev"), InvalidArgument);
}

TEST_CASE("ExampleLoader delivers every valid segment of a schema 1/2 split once per epoch in the planned order",
          "[data]") {
  const auto out = legacy(mel::DType::float16);
  const auto info = data::read_split_info(out / "train.h5", "train");
  const auto ref = read_legacy(out / "train.h5");
  const bool shuffle = GENERATE(false, true);
  const int64_t prefetch = GENERATE(0, 1, 3);
  const int64_t pool_chunks = GENERATE(1, 3);
  const int in_memory = GENERATE(0, 1);
  data::LoaderOptions o;
  o.batch_size = 7;
  o.shuffle = shuffle;
  o.seed = 11;
  o.prefetch = prefetch;
  o.pool_chunks = pool_chunks;
  o.in_memory = in_memory;
  data::ExampleLoader loader = segment_loader(info, o);
  CHECK(loader.in_memory() == (in_memory == 1));
  const int64_t n = loader.size();
  REQUIRE(n == info.valid_segments());
  CHECK(loader.batches_per_epoch() == (n + 6) / 7);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> order = loader.order(epoch);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    REQUIRE(sorted == all);
    if (!shuffle) CHECK(order == all);
    const int64_t chunks_before = loader.chunks_read();
    const Epoch e = run_epoch(loader, epoch);
    REQUIRE(static_cast<int64_t>(e.y.size()) == n);
    CHECK(e.batches == loader.batches_per_epoch());
    const int64_t chunks = (info.files() + 1) / 2;
    CHECK(loader.chunks_read() - chunks_before == (in_memory == 1 && epoch > 0 ? 0 : chunks));
    const int64_t per = info.info.n_mels * info.info.n_frames;
    CHECK(std::all_of(e.lengths.begin(), e.lengths.end(), [&](int64_t l) { return l == info.info.n_frames; }));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = order[static_cast<size_t>(i)];
      const auto r = data::segment_at(info.segment_offsets(), info.info.num_short, p);
      CHECK(e.file[static_cast<size_t>(i)] == r.file);
      CHECK(e.y[static_cast<size_t>(i)] == ref.label[static_cast<size_t>(r.file)]);
      const auto want = reference_segment(ref, info, p);
      CHECK(std::memcmp(e.x.data() + i * per, want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("ExampleLoader's order depends on seed and epoch only", "[data]") {
  const auto out = legacy(mel::DType::float32);
  const auto info = data::read_split_info(out / "train.h5", "train");
  auto run = [&](uint64_t seed, int64_t prefetch, int64_t epoch, int in_memory = 0) {
    data::LoaderOptions o;
    o.in_memory = in_memory;
    o.batch_size = 5;
    o.seed = seed;
    o.prefetch = prefetch;
    o.pool_chunks = 2;
    data::ExampleLoader loader = segment_loader(info, o);
    return run_epoch(loader, epoch);
  };
  const Epoch a = run(3, 0, 1), b = run(3, 4, 1), c = run(4, 4, 1), e = run(3, 2, 2), r = run(3, 2, 1, 1);
  CHECK(a.x == b.x);
  CHECK(a.x == r.x);
  CHECK(a.file == r.file);
  CHECK(a.file == b.file);
  CHECK(a.file != c.file);
  CHECK(a.file != e.file);
  std::multiset<int64_t> fa(a.file.begin(), a.file.end()), fc(c.file.begin(), c.file.end());
  CHECK(fa == fc);
}

TEST_CASE("ExampleLoader drop_last drops only the final partial batch", "[data]") {
  const auto out = legacy(mel::DType::float16);
  const auto info = data::read_split_info(out / "train.h5", "train");
  int64_t batch = GENERATE(3, 9);
  while (info.valid_segments() % batch == 0) ++batch;
  data::LoaderOptions o;
  o.batch_size = batch;
  o.drop_last = true;
  data::ExampleLoader loader = segment_loader(info, o);
  const int64_t n = loader.size();
  REQUIRE(n % batch != 0);
  CHECK(loader.batches_per_epoch() == n / batch);
  const Epoch e = run_epoch(loader, 0);
  CHECK(static_cast<int64_t>(e.y.size()) == n / batch * batch);
  const std::vector<int64_t> order = loader.order(0);
  for (int64_t i = 0; i < n / batch * batch; ++i) {
    const auto r = data::segment_at(info.segment_offsets(), info.info.num_short, order[static_cast<size_t>(i)]);
    CHECK(e.file[static_cast<size_t>(i)] == r.file);
  }
}

TEST_CASE("ExampleLoader refuses bad options before reading", "[data]") {
  data::LoaderOptions o;
  o.batch_size = 0;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  o = {};
  o.prefetch = -1;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  o = {};
  o.pool_chunks = 0;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  o = {};
  o.in_memory = 2;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  o = {};
  o.frame_budget = -1;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  o.frame_budget = 100;
  o.drop_last = true;
  CHECK_THROWS_AS(o.validate(), InvalidArgument);
  data::SplitInfo empty;
  empty.path = "/nonexistent/train.h5";
  empty.frame_offset = {0};
  const std::shared_ptr<const data::views::View> view = data::views::make_tiles_view_frames(4, 4, 0.0);
  CHECK_THROWS_AS(data::ExampleLoader(empty, view, 0, data::LoaderOptions{}, 0.0f), FormatError);
  CHECK_THROWS_AS(data::ExampleLoader(empty, nullptr, 0, data::LoaderOptions{}, 0.0f), InvalidArgument);
}

namespace {

/// Clip lengths of the schema 3 loader tests: single frames, around the tile (4) and crop (6) lengths, long ones.
const std::vector<int64_t> kClipFrames = {1, 7, 2, 13, 1, 30, 5, 4, 1, 9, 17, 3, 6};

/// A schema 3 split with kClipFrames in `dir`, multi-label when `multilabel` (each clip also carries class
/// (label + 1) % classes when its index is even); returns what was written and the targets matrix.
test::ClipSplitData clip_split(const std::filesystem::path& path, bool half, bool multilabel,
                               std::vector<uint8_t>& targets) {
  const auto d = test::write_clip_split(path, {.clip_frames = kClipFrames, .half = half, .chunk_rows = 5});
  targets.clear();
  if (!multilabel) return d;
  const int64_t classes = 3, files = static_cast<int64_t>(kClipFrames.size());
  targets.assign(static_cast<std::size_t>(files * classes), 0);
  for (int64_t f = 0; f < files; ++f) {
    const int64_t label = d.labels[static_cast<std::size_t>(f)];
    targets[static_cast<std::size_t>(f * classes + label)] = 1;
    if (f % 2 == 0) targets[static_cast<std::size_t>(f * classes + (label + 1) % classes)] = 1;
  }
  auto file = h5::open_file(path, true);
  h5::write_uint8_matrix(file, "targets", files, classes, targets);
  return d;
}

/// Every row of every batch of one epoch, checked against a naive gather of the written frames; returns the
/// examples in delivery order.
std::vector<data::views::Example> check_epoch(data::ExampleLoader& loader, int64_t epoch,
                                              const test::ClipSplitData& d, const std::vector<uint8_t>& targets,
                                              float pad) {
  const int64_t m = loader.split().info.n_mels;
  const auto examples = loader.examples(epoch);
  const auto order = loader.order(epoch);
  REQUIRE(order.size() == examples.size());
  std::vector<data::views::Example> delivered;
  loader.start_epoch(epoch);
  int64_t k = 0;
  while (auto b = loader.next()) {
    REQUIRE(b->size >= 1);
    for (int64_t r = 0; r < b->size; ++r, ++k) {
      const data::views::Example& e = examples[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])];
      delivered.push_back(e);
      const auto i = static_cast<std::size_t>(r);
      CHECK(b->clip[i] == e.clip);
      CHECK(b->start[i] == e.start);
      CHECK(b->lengths[i] == e.real);
      CHECK(b->y[i] == d.labels[static_cast<std::size_t>(e.clip)]);
      const auto source = data::views::source_frames(e, b->length);
      const int64_t base = d.frame_offset[static_cast<std::size_t>(e.clip)];
      for (int64_t mel = 0; mel < m; ++mel)
        for (int64_t t = 0; t < b->length; ++t) {
          const int64_t s = source[static_cast<std::size_t>(t)];
          const float want = s < 0 ? pad : d.frames[static_cast<std::size_t>((base + s) * m + mel)];
          REQUIRE(b->x[static_cast<std::size_t>((r * m + mel) * b->length + t)] == want);
        }
      const int64_t classes = targets.empty() ? 0 : 3;
      REQUIRE(b->targets.size() == static_cast<std::size_t>(b->size * classes));
      for (int64_t c = 0; c < classes; ++c)
        CHECK(b->targets[static_cast<std::size_t>(r * classes + c)] ==
              static_cast<float>(targets[static_cast<std::size_t>(e.clip * classes + c)]));
    }
  }
  CHECK(k == static_cast<int64_t>(examples.size()));
  return delivered;
}

}  // namespace

TEST_CASE("ExampleLoader serves tiles, crops and whole clips of a schema 3 split as written", "[data][clips]") {
  test::TempDir dir;
  const bool half = GENERATE(false, true);
  const bool multilabel = GENERATE(false, true);
  const int in_memory = GENERATE(0, 1);
  const int64_t prefetch = GENERATE(as<int64_t>{}, 0, 2);
  const bool shuffle = GENERATE(false, true);
  std::vector<uint8_t> targets;
  const auto d = clip_split(dir / "train.h5", half, multilabel, targets);
  const data::SplitInfo info = data::read_split_info(dir / "train.h5", "train");
  const float pad = data::views::pad_value(info);
  CHECK(pad == -100.0f);
  data::views::ViewOptions crops;
  crops.view = "crops";
  crops.crop_seconds = 0.06;
  crops.short_clips = GENERATE(data::views::ShortClips::pad, data::views::ShortClips::repeat);
  std::vector<std::shared_ptr<const data::views::View>> views = {
      data::views::make_tiles_view_frames(4, 3, 0.5), data::views::make_view(crops, {16000, 160})};
  for (const auto& view : views) {
    data::LoaderOptions o{.batch_size = 4, .shuffle = shuffle, .seed = 5, .prefetch = prefetch, .pool_chunks = 2,
                          .in_memory = in_memory};
    data::ExampleLoader loader(info, view, 9, o, pad);
    const auto e0 = check_epoch(loader, 0, d, targets, pad);
    const auto e1 = check_epoch(loader, 1, d, targets, pad);
    CHECK((e0 != e1) == (shuffle || view->varies_by_epoch()));
    CHECK(check_epoch(loader, 0, d, targets, pad) == e0);
  }
  data::LoaderOptions o{.batch_size = 3, .shuffle = shuffle, .seed = 5, .prefetch = prefetch, .in_memory = in_memory,
                        .frame_budget = 40};
  data::ExampleLoader clips(info, data::views::make_view({.view = "clips"}, {16000, 160}), 0, o, pad);
  const auto delivered = check_epoch(clips, 0, d, targets, pad);
  std::vector<int64_t> seen;
  for (const auto& e : delivered) seen.push_back(e.clip);
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(kClipFrames.size());
  std::iota(all.begin(), all.end(), 0);
  CHECK(seen == all);
  clips.start_epoch(0);
  int64_t previous = 0;
  while (auto b = clips.next()) {
    CHECK(b->size <= 3);
    CHECK((b->size == 1 || b->size * b->length <= 40));
    if (!shuffle) CHECK(b->length >= previous);
    previous = b->length;
  }
}

TEST_CASE("ExampleLoader reads each schema 3 block once per streamed epoch", "[data][clips]") {
  test::TempDir dir;
  std::vector<uint8_t> targets;
  const auto d = clip_split(dir / "train.h5", false, false, targets);
  const data::SplitInfo info = data::read_split_info(dir / "train.h5", "train");
  const data::ClipReader probe(info, 0);
  int64_t expected = 0;
  for (int64_t c0 = 0; c0 < info.files();) {
    int64_t c1 = c0 + 1;
    while (c1 < info.files() && probe.chunk_of_clip(c1) == probe.chunk_of_clip(c0)) ++c1;
    const int64_t r0 = info.frame_offset[static_cast<std::size_t>(c0)];
    const int64_t r1 = info.frame_offset[static_cast<std::size_t>(c1)];
    expected += (r1 - 1) / 5 - r0 / 5 + 1;
    c0 = c1;
  }
  data::LoaderOptions o{.batch_size = 4, .seed = 1, .pool_chunks = GENERATE(as<int64_t>{}, 1, 3), .in_memory = 0};
  data::ExampleLoader loader(info, data::views::make_tiles_view_frames(4, 4, 0.0), 0, o, 0.0f);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const int64_t before = loader.chunks_read();
    run_epoch(loader, epoch);
    CHECK(loader.chunks_read() - before == expected);
  }
  CHECK(expected <= 2 * ((d.frame_offset.back() + 4) / 5));
}

TEST_CASE("make_split_view: schema 1/2 only as their segments, schema 3 with its default tile", "[data][clips]") {
  const data::SplitInfo v1 = data::read_split_info(test::legacy_dataset(1) / "train.h5", "train");
  data::views::ViewOptions o;
  CHECK(data::views::make_split_view(v1, o, true, false)->examples(v1.clip_frame_counts(), 0, 0).size() ==
        static_cast<std::size_t>(v1.valid_segments()));
  for (const char* view : {"crops", "clips"}) {
    o.view = view;
    try {
      data::views::make_split_view(v1, o, true, false);
      FAIL("no error");
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("schema 1") != std::string::npos);
      CHECK(std::string(e.what()).find(view) != std::string::npos);
    }
  }
  o = {};
  CHECK_THROWS_AS(data::views::make_split_view(v1, o, false, false), InvalidArgument);
  test::TempDir dir;
  test::write_clip_split(dir / "train.h5", {.clip_frames = {3, 19}});
  const data::SplitInfo v3 = data::read_split_info(dir / "train.h5", "train");
  const auto tiles = data::views::make_split_view(v3, o, true, false)->examples(v3.clip_frame_counts(), 0, 0);
  REQUIRE(tiles.size() == 3);
  CHECK(tiles[0].length == 8);
  CHECK(tiles[0].real == 3);
  CHECK(tiles[2].start == 8);
  CHECK(data::views::make_split_view(v3, o, true, true)->examples(v3.clip_frame_counts(), 0, 0).size() == 4);
  o.tile_seconds = 0.05;
  o.tile_hop = 0.02;
  CHECK(data::views::make_split_view(v3, o, false, false)->examples(v3.clip_frame_counts(), 0, 0) ==
        data::views::make_tiles_view_frames(5, 2, 0.5)->examples(v3.clip_frame_counts(), 0, 0));
}

}  // namespace melforge_test_data_loader
