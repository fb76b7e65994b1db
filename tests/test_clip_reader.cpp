// melforge_data's clip layer (issue 28): SplitInfo's clip table for schema 3 files written here with known values and
// for the committed schema 1/2 datasets; ClipReader's frames against the written values (both dtypes, clips of 1..K
// frames, every range) and, for schema 1/2, tiles of n_frames equal to MelReader's segments exactly; gather_example
// against a naive reference; hostile schema 3 files refused with the file and the field named, before allocating.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "clip_fixture.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "reader/clip_reader.h"
#include "reader/mel_reader.h"
#include "reader/split_info.h"
#include "test_util.h"
#include "views/gather.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge_test_clip_reader {

using namespace melforge;
namespace fs = std::filesystem;

namespace {

/// Clip lengths around the chunk sizes of the tests, single frames included.
const std::vector<int64_t> kClips = {1, 7, 2, 13, 1, 30, 5, 4, 1, 9};

/// The expected frames [first, first + count) of clip `clip`.
std::vector<float> expected(const test::ClipSplitData& d, int64_t n_mels, int64_t clip, int64_t first, int64_t count) {
  const auto begin = d.frames.begin() + (d.frame_offset[static_cast<std::size_t>(clip)] + first) * n_mels;
  return {begin, begin + count * n_mels};
}

/// Throws unless `f` throws FormatError whose message holds every string of `parts`.
void require_format_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const FormatError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      INFO(what);
      CHECK(what.find(p) != std::string::npos);
    }
    return;
  }
  FAIL("no FormatError");
}

/// x[m][i] of example `e` by the definition: source_frames, then the pad value.
std::vector<float> naive_gather(const data::views::Example& e, const std::vector<float>& clip, int64_t n_mels,
                                int64_t out_length, float pad) {
  std::vector<float> x(static_cast<std::size_t>(n_mels * out_length), pad);
  const auto source = data::views::source_frames(e, out_length);
  for (int64_t i = 0; i < out_length; ++i)
    for (int64_t m = 0; m < n_mels; ++m)
      if (source[static_cast<std::size_t>(i)] >= 0)
        x[static_cast<std::size_t>(m * out_length + i)] =
            clip[static_cast<std::size_t>(source[static_cast<std::size_t>(i)] * n_mels + m)];
  return x;
}

}  // namespace

TEST_CASE("SplitInfo reads the clip table of a schema 3 file", "[data][clips]") {
  const bool half = GENERATE(false, true);
  test::TempDir dir;
  test::ClipSplitSpec spec{.clip_frames = kClips, .half = half};
  const auto d = test::write_clip_split(dir / "train.h5", spec);
  const data::SplitInfo s = data::read_split_info(dir / "train.h5", "train");
  CHECK(s.schema_version == 3);
  CHECK(s.files() == static_cast<int64_t>(kClips.size()));
  CHECK(s.frame_offset == d.frame_offset);
  CHECK(s.num_samples == d.num_samples);
  CHECK(s.clip_flags == d.clip_flags);
  CHECK(s.clip_frame_counts() == kClips);
  CHECK(s.total_frames() == d.frame_offset.back());
  CHECK(s.clip_frames(5) == 30);
  CHECK_THROWS_AS(s.clip_frames(s.files()), InvalidArgument);
  CHECK(s.num_valid_long.empty());
  CHECK(s.valid_segments() == 0);
  CHECK(s.paths == d.paths);
  CHECK(std::equal(s.labels.begin(), s.labels.end(), d.labels.begin(), d.labels.end()));
  CHECK(s.info.num_long == 0);
  CHECK(s.info.num_short == 0);
  CHECK(s.info.short_files.empty());
  CHECK(s.info.n_frames == 8);
  CHECK(s.info.dtype == (spec.half ? "float16" : "float32"));
  CHECK(data::MelInfo::from_json(s.info.to_json()).first_difference(s.info, "a", "b").empty());
}

TEST_CASE("a schema 3 split with no clip reads as empty", "[data][clips]") {
  test::TempDir dir;
  test::write_clip_split(dir / "val.h5", {.clip_frames = {}, .split = "val"});
  const data::SplitInfo s = data::read_split_info(dir / "val.h5", "val");
  CHECK(s.files() == 0);
  CHECK(s.frame_offset == std::vector<int64_t>{0});
  CHECK(s.total_frames() == 0);
  const data::ClipReader reader(s, 0);
  CHECK(reader.clips() == 0);
  reader.read_clips(0, 0, nullptr);
  CHECK_THROWS_AS(reader.read_clips(0, 1, nullptr), InvalidArgument);
}

TEST_CASE("ClipReader reads schema 3 frames and clips as written", "[data][clips]") {
  test::TempDir dir;
  const bool half = GENERATE(false, true);
  const int64_t chunk_rows = GENERATE(as<int64_t>{}, 1, 5, 64);
  test::ClipSplitSpec spec{.clip_frames = kClips, .half = half, .chunk_rows = chunk_rows};
  const auto d = test::write_clip_split(dir / "train.h5", spec);
  const data::SplitInfo s = data::read_split_info(dir / "train.h5", "train");
  const data::ClipReader reader(s, 0);
  REQUIRE(reader.clips() == s.files());
  CHECK(reader.n_mels() == spec.n_mels);
  CHECK(reader.total_frames() == d.frame_offset.back());
  CHECK(reader.rows_per_chunk() == chunk_rows);
  for (int64_t c = 0; c < reader.clips(); ++c) {
    CHECK(reader.chunk_of_clip(c) == d.frame_offset[static_cast<std::size_t>(c)] / chunk_rows);
    const int64_t frames = kClips[static_cast<std::size_t>(c)];
    for (int64_t first = 0; first < frames; ++first)
      for (int64_t count = 1; first + count <= frames; count += 3) {
        std::vector<float> got(static_cast<std::size_t>(count * spec.n_mels));
        reader.read_frames(c, first, count, got.data());
        REQUIRE(got == expected(d, spec.n_mels, c, first, count));
      }
    std::vector<float> one(static_cast<std::size_t>(spec.n_mels));
    CHECK_THROWS_AS(reader.read_frames(c, frames, 1, one.data()), InvalidArgument);
    CHECK_THROWS_AS(reader.read_frames(c, -1, 1, one.data()), InvalidArgument);
  }
  for (int64_t first = 0; first < reader.clips(); ++first)
    for (int64_t count = 1; first + count <= reader.clips(); ++count) {
      const int64_t f0 = d.frame_offset[static_cast<std::size_t>(first)];
      const int64_t f1 = d.frame_offset[static_cast<std::size_t>(first + count)];
      std::vector<float> got(static_cast<std::size_t>((f1 - f0) * spec.n_mels));
      reader.read_clips(first, count, got.data());
      REQUIRE(got == std::vector<float>(d.frames.begin() + f0 * spec.n_mels, d.frames.begin() + f1 * spec.n_mels));
    }
  std::vector<float> one(static_cast<std::size_t>(spec.n_mels));
  CHECK_THROWS_AS(reader.read_frames(reader.clips(), 0, 1, one.data()), InvalidArgument);
  CHECK_THROWS_AS(reader.read_clips(1, reader.clips(), one.data()), InvalidArgument);
  const int64_t before = reader.chunks_read();
  std::vector<float> all(d.frames.size());
  reader.read_clips(0, reader.clips(), all.data());
  CHECK(reader.chunks_read() - before == (d.frame_offset.back() + chunk_rows - 1) / chunk_rows);
}

TEST_CASE("ClipReader names the clip and its file when a frame is not finite", "[data][clips]") {
  test::TempDir dir;
  const auto d = test::write_clip_split(dir / "train.h5", {.clip_frames = {3, 4}});
  {
    auto f = h5::open_file(dir / "train.h5", true);
    auto frames = h5::open_dataset(f, "frames");
    const hsize_t start[2] = {5, 2}, count[2] = {1, 1};
    h5::Dataspace space = h5::dataset_space(frames);
    H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    const hsize_t one = 1;
    h5::Dataspace mem(H5Screate_simple(1, &one, nullptr), "mem");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    REQUIRE(H5Dwrite(frames.id(), H5T_NATIVE_FLOAT, mem.id(), space.id(), H5P_DEFAULT, &nan) >= 0);
  }
  const data::SplitInfo s = data::read_split_info(dir / "train.h5", "train");
  const data::ClipReader reader(s, 0);
  std::vector<float> out(7 * 5);
  reader.read_frames(1, 0, 2, out.data());
  require_format_error([&] { reader.read_frames(1, 1, 3, out.data()); },
                       {(dir / "train.h5").string(), "row 1", d.paths[1], "NaN", "frame 2"});
  require_format_error([&] { reader.read_clips(0, 2, out.data()); }, {"row 1", d.paths[1]});
}

TEST_CASE("schema 1 and 2: the clip table is the valid segments side by side", "[data][clips]") {
  const int schema = GENERATE(1, 2);
  const std::string split = GENERATE("train", "val", "test");
  const data::SplitInfo s = data::read_split_info(test::legacy_dataset(schema) / (split + ".h5"), split);
  CHECK(s.schema_version == schema);
  REQUIRE(s.files() >= 6);
  REQUIRE(s.frame_offset.size() == static_cast<std::size_t>(s.files()) + 1);
  CHECK(s.frame_offset.front() == 0);
  int64_t single = 0;
  for (int64_t f = 0; f < s.files(); ++f) {
    const int64_t valid = s.num_valid_long[static_cast<std::size_t>(f)];
    single += valid == 1;
    CHECK(s.clip_frames(f) == valid * s.info.num_short * s.info.n_frames);
    CHECK(s.num_samples[static_cast<std::size_t>(f)] == valid * s.info.long_samples);
    CHECK(s.clip_flags[static_cast<std::size_t>(f)] == 0);
  }
  CHECK(single > 0);
  CHECK(s.total_frames() == s.valid_segments() * s.info.n_frames);
  CHECK(s.info.max_seconds == 0);
}

TEST_CASE("schema 1 and 2: a long_samples that is not positive or overflows the clip length is refused",
          "[data][clips][untrusted]") {
  const int64_t value = GENERATE(int64_t{0}, int64_t{-5}, std::numeric_limits<int64_t>::max() / 2);
  CAPTURE(value);
  test::TempDir dir;
  fs::copy_file(test::legacy_dataset(1) / "train.h5", dir / "train.h5");
  {
    auto f = h5::open_file(dir / "train.h5", true);
    h5::write_attribute_int64(f, "long_samples", value);
  }
  try {
    data::read_split_info(dir / "train.h5", "train");
    FAIL("a long_samples of " << value << " was read");
  } catch (const FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("train.h5") && Catch::Contains("long_samples"));
  }
}

TEST_CASE("schema 1 and 2: tiles of n_frames read through ClipReader are exactly MelReader's segments",
          "[data][clips]") {
  const int schema = GENERATE(1, 2);
  const std::string split = GENERATE("train", "test");
  const data::SplitInfo s = data::read_split_info(test::legacy_dataset(schema) / (split + ".h5"), split);
  const data::ClipReader clips(s, 0);
  const data::MelReader mel(s.path, 0);
  const int64_t m = s.info.n_mels, t = s.info.n_frames;
  CHECK(clips.rows_per_chunk() == mel.files_per_chunk());
  const auto view = data::views::make_tiles_view_frames(t, t, 0.0);
  const auto examples = view->examples(s.clip_frame_counts(), 0, 0);
  REQUIRE(static_cast<int64_t>(examples.size()) == s.valid_segments());
  std::vector<float> all(static_cast<std::size_t>(s.total_frames() * m));
  clips.read_clips(0, s.files(), all.data());
  const auto offsets = s.segment_offsets();
  std::vector<float> segment(static_cast<std::size_t>(m * t)), x(segment.size()), frames;
  for (std::size_t k = 0; k < examples.size(); ++k) {
    const data::views::Example& e = examples[k];
    CHECK(e.real == t);
    const data::SegmentRef ref = data::segment_at(offsets, s.info.num_short, static_cast<int64_t>(k));
    REQUIRE(ref.file == e.clip);
    mel.read_segment(ref.file, ref.long_index, ref.short_index, segment.data());
    frames.resize(static_cast<std::size_t>(e.clip_frames * m));
    clips.read_frames(e.clip, 0, e.clip_frames, frames.data());
    CHECK(data::views::gather_example(e, frames.data(), m, t, 0.0f, x.data()) == t);
    REQUIRE(x == segment);
    const auto begin = all.begin() + s.frame_offset[static_cast<std::size_t>(e.clip)] * m;
    REQUIRE(std::equal(frames.begin(), frames.end(), begin));
  }
}

TEST_CASE("gather_example lays examples out mel-major, padded or repeated, as the reference", "[data][clips]") {
  const int64_t m = 3, frames = GENERATE(1, 5, 12);
  const auto short_clips = GENERATE(data::views::ShortClips::pad, data::views::ShortClips::repeat);
  std::vector<float> clip(static_cast<std::size_t>(frames * m));
  for (std::size_t i = 0; i < clip.size(); ++i) clip[i] = static_cast<float>(i) + 0.5f;
  std::vector<data::views::Example> examples;
  for (const int64_t length : {1, 4, 8, 20}) {
    data::views::ViewOptions o;
    o.view = "crops";
    o.crop_seconds = static_cast<double>(length) / 100.0;
    o.short_clips = short_clips;
    const auto crops = data::views::make_view(o, {.sample_rate = 16000, .hop_length = 160});
    for (int64_t epoch = 0; epoch < 3; ++epoch) crops->clip_examples(0, frames, 7, epoch, examples);
    data::views::make_tiles_view_frames(length, std::max<int64_t>(1, length / 2), 0.0)
        ->clip_examples(0, frames, 0, 0, examples);
  }
  for (const data::views::Example& e : examples) {
    for (const int64_t out_length : {e.real, e.length, e.length + 3}) {
      if (out_length < e.real) continue;
      std::vector<float> x(static_cast<std::size_t>(m * out_length), 1e9f);
      CHECK(data::views::gather_example(e, clip.data(), m, out_length, -100.0f, x.data()) == e.real);
      REQUIRE(x == naive_gather(e, clip, m, out_length, -100.0f));
    }
  }
  REQUIRE(!examples.empty());
  std::vector<float> x(static_cast<std::size_t>(m * 40));
  data::views::Example bad = examples.front();
  CHECK_THROWS_AS(data::views::gather_example(bad, clip.data(), m, bad.real - 1, 0.0f, x.data()), InvalidArgument);
  bad.start = bad.clip_frames;
  CHECK_THROWS_AS(data::views::gather_example(bad, clip.data(), m, 40, 0.0f, x.data()), InvalidArgument);
}

TEST_CASE("make_tiles_view_frames refuses bad counts and is what the tiles view makes", "[data][clips]") {
  CHECK_THROWS_AS(data::views::make_tiles_view_frames(0, 1, 0.5), InvalidArgument);
  CHECK_THROWS_AS(data::views::make_tiles_view_frames(8, 0, 0.5), InvalidArgument);
  CHECK_THROWS_AS(data::views::make_tiles_view_frames(8, 9, 0.5), InvalidArgument);
  CHECK_THROWS_AS(data::views::make_tiles_view_frames(8, 4, 1.5), InvalidArgument);
  CHECK_THROWS_AS(data::views::make_tiles_view_frames(8, 4, std::nan("")), InvalidArgument);
  data::views::ViewOptions o;
  o.tile_seconds = 0.08;
  o.tile_hop = 0.03;
  const std::vector<int64_t> frames = {1, 7, 8, 9, 30};
  CHECK(data::views::make_view(o, {.sample_rate = 16000, .hop_length = 160})->examples(frames, 0, 0) ==
        data::views::make_tiles_view_frames(8, 3, 0.5)->examples(frames, 0, 0));
}

TEST_CASE("hostile schema 3 files are refused naming the file and the field, before allocating", "[data][clips]") {
  using Mutate = std::function<void(const fs::path&)>;
  constexpr int64_t kHuge = int64_t{1} << 40;
  const auto row = GENERATE(table<std::string, Mutate, std::vector<std::string>>({
      {"offset not increasing",
       [](const fs::path& p) { test::replace_int_dataset(p, "frame_offset", H5T_STD_I64LE, {0, 3, 3, 7}); },
       {"frame_offset[2] = 3", "not above"}},
      {"offset not starting at 0",
       [](const fs::path& p) { test::replace_int_dataset(p, "frame_offset", H5T_STD_I64LE, {1, 3, 5, 7}); },
       {"frame_offset[0] = 1"}},
      {"offset last not N",
       [](const fs::path& p) { test::replace_int_dataset(p, "frame_offset", H5T_STD_I64LE, {0, 3, 5, 6}); },
       {"frame_offset[3] = 6", "7 rows of frames"}},
      {"offset of the wrong length",
       [](const fs::path& p) { test::replace_int_dataset(p, "frame_offset", H5T_STD_I64LE, {0, 3, 7}); },
       {"num_samples has shape [3]"}},
      {"offset of floats",
       [](const fs::path& p) { test::replace_int_dataset(p, "frame_offset", H5T_IEEE_F64LE, {0, 3, 5, 7}); },
       {"frame_offset is not an integer dataset"}},
      {"frames of the wrong width",
       [](const fs::path& p) { test::replace_by_empty_claim(p, "frames", H5T_IEEE_F32LE, {7, 6}); },
       {"frames has shape [7, 6]", "n_mels = 5"}},
      {"frames of integers",
       [](const fs::path& p) { test::replace_by_empty_claim(p, "frames", H5T_STD_I32LE, {7, 5}); },
       {"frames is not a float16 or float32"}},
      {"num_samples below 1",
       [](const fs::path& p) { test::replace_int_dataset(p, "num_samples", H5T_STD_I64LE, {100, 0, 30}); },
       {"num_samples[1] = 0", "clips/1.wav"}},
      {"clip_flags with unknown bits",
       [](const fs::path& p) { test::replace_int_dataset(p, "clip_flags", H5T_STD_U8LE, {0, 4, 3}); },
       {"clip_flags[1] = 4", "clips/1.wav"}},
      {"clip_flags negative",
       [](const fs::path& p) { test::replace_int_dataset(p, "clip_flags", H5T_STD_I16LE, {0, 0, -1}); },
       {"clip_flags[2] = -1"}},
      {"more clips than frames",
       [](const fs::path& p) { test::replace_by_empty_claim(p, "frame_offset", H5T_STD_I64LE, {kHuge + 1}); },
       {"train.h5:/frame_offset: declares 8388608 MiB", "not stored in the file"}},
      {"huge F and N",
       [](const fs::path& p) {
         test::replace_by_empty_claim(p, "frames", H5T_IEEE_F32LE, {kHuge, 5});
         test::replace_by_empty_claim(p, "frame_offset", H5T_STD_I64LE, {kHuge + 1});
         for (const char* name : {"num_samples", "clip_flags", "label"})
           test::replace_by_empty_claim(p, name, H5T_STD_I64LE, {kHuge});
         test::replace_by_empty_claim(p, "path", h5::utf8_string_type().id(), {kHuge});
       },
       {"train.h5:/frames: declares 20971520 MiB", "not stored in the file"}},
      {"label of the wrong length",
       [](const fs::path& p) { test::replace_int_dataset(p, "label", H5T_STD_I32LE, {0, 1}); },
       {"label has shape [2]"}},
      {"missing frame_offset",
       [](const fs::path& p) {
         auto f = h5::open_file(p, true);
         H5Ldelete(f.id(), "frame_offset", H5P_DEFAULT);
       },
       {"frame_offset"}},
  }));
  const auto& [name, mutate, parts] = row;
  INFO(name);
  test::TempDir dir;
  const fs::path path = dir / "train.h5";
  test::write_clip_split(path, {.clip_frames = {3, 2, 2}});
  mutate(path);
  std::vector<std::string> expect = parts;
  expect.push_back(path.string());
  require_format_error([&] { data::read_split_info(path, "train"); }, expect);
}

TEST_CASE("schema 3 attributes: the grid ones may be absent, max_seconds optional and checked", "[data][clips]") {
  test::TempDir dir;
  const fs::path path = dir / "train.h5";
  test::write_clip_split(path, {.clip_frames = {3}});
  {
    auto f = h5::open_file(path, true);
    h5::write_attribute_double(f, "max_seconds", 12.5);
  }
  CHECK(data::read_split_info(path, "train").info.max_seconds == 12.5);
  {
    auto f = h5::open_file(path, true);
    H5Adelete(f.id(), "max_seconds");
  }
  CHECK(data::read_split_info(path, "train").info.max_seconds == 0.0);
  {
    auto f = h5::open_file(path, true);
    h5::write_attribute_double(f, "max_seconds", -1.0);
  }
  require_format_error([&] { data::read_split_info(path, "train"); }, {path.string(), "max_seconds = -1"});
  {
    auto f = h5::open_file(path, true);
    h5::write_attribute_double(f, "max_seconds", 0.0);
    H5Adelete(f.id(), "n_frames");
  }
  require_format_error([&] { data::read_split_info(path, "train"); }, {path.string(), "n_frames"});
  nlohmann::json old = data::read_split_info(test::legacy_dataset(1) / "train.h5", "train").info.to_json();
  old.erase("max_seconds");
  CHECK(data::MelInfo::from_json(old).max_seconds == 0.0);
  old.erase("num_long");
  CHECK_THROWS_AS(data::MelInfo::from_json(old), FormatError);
}

}  // namespace melforge_test_clip_reader
