// The trainer's dataset reader: clips read back exactly (schema-3 files written by tests/clip_fixture.h and by the
// builder library), in RAM and streamed; every inconsistency between the split files refused with a FormatError that
// names it; the views a split is read through (resolve_view_options, split_view, example_frames) and
// gather_examples against a naive reference.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <functional>

#include "data/dataset.h"
#include "clip_fixture.h"
#include "h5_writer.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"
#include "trainer_fixture.h"
#include "views/view.h"
#include "views/view_options.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_dataset {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A build of the tone corpus at `root/in` (3 classes x 6 files, written on first use) into `root/<out>`.
builder::BuildConfig build(const TempDir& root, const std::string& out) {
  if (!fs::exists(root / "in")) test::write_tone_corpus(root / "in", 3, 5);
  return test::tiny_build_config(root / "in", root / out);
}

void replace_file(const fs::path& from, const fs::path& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

/// Message of the FormatError `f` throws; fails the test when it throws nothing or another type.
template <typename F>
std::string format_error(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("no FormatError");
  return {};
}

/// Removes the `build_id` root attribute from the three split files of `dir`, as in a dataset written before it
/// existed (whose splits are compared by their parameters alone).
void strip_build_ids(const fs::path& dir) {
  for (const auto& s : trainer::kSplitNames) {
    auto f = h5::open_file(dir / (s + ".h5"), true);
    REQUIRE(H5Adelete(f.id(), "build_id") >= 0);
  }
}

void write_int32_dataset(const fs::path& file, const std::string& name, int32_t value) {
  auto f = h5::open_file(file, true);
  auto ds = h5::open_dataset(f, name);
  const auto n = h5::dims(ds).at(0);
  std::vector<int32_t> values(static_cast<std::size_t>(n), value);
  REQUIRE(H5Dwrite(ds.id(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
}

}  // namespace

TEST_CASE("the reader supports the schema version the builder writes", "[trainer][dataset]") {
  CHECK(trainer::kSupportedSchemaVersion == builder::kSchemaVersion);
}

/// A schema-3 dataset folder written by tests/clip_fixture.h (16 kHz, hop 160, 8 mels): train clips of
/// `train_frames` frames, val and test a few; returns what train.h5 holds.
test::ClipSplitData clip_dataset(const fs::path& dir, const std::vector<int64_t>& train_frames, bool half = false) {
  fs::create_directories(dir);
  test::ClipSplitData train;
  for (const std::string split : {"train", "val", "test"}) {
    test::ClipSplitSpec spec;
    spec.split = split;
    spec.n_mels = 8;
    spec.half = half;
    spec.clip_frames = split == "train" ? train_frames : std::vector<int64_t>{5, 9, 2};
    const test::ClipSplitData written = test::write_clip_split(dir / (split + ".h5"), spec);
    if (split == "train") train = written;
  }
  return train;
}

TEST_CASE("a schema-3 dataset reads back as the stored frames and clip table, in RAM and streamed",
          "[trainer][dataset]") {
  const bool half = GENERATE(false, true);
  CAPTURE(half);
  TempDir d;
  const std::vector<int64_t> frames = {7, 1, 30, 12, 4, 19};
  const test::ClipSplitData w = clip_dataset(d / "out", frames, half);
  const trainer::Dataset ds = trainer::load_dataset(d / "out");
  const trainer::Split& sp = ds.train;
  CHECK(sp.meta.schema_version == 3);
  REQUIRE(sp.files() == 6);
  CHECK(sp.clip_frame_counts() == frames);
  CHECK(sp.clip_frames(2) == 30);
  CHECK_THROWS_AS(sp.clip_frames(6), InvalidArgument);
  CHECK(sp.total_frames() == 73);
  CHECK(sp.meta.frame_offset == w.frame_offset);
  CHECK(sp.meta.num_samples == w.num_samples);
  CHECK(sp.meta.clip_flags == w.clip_flags);
  CHECK(sp.paths == w.paths);
  REQUIRE(sp.frames.defined());
  CHECK(sp.frames.sizes().vec() == std::vector<int64_t>{73, 8});
  CHECK(std::equal(w.frames.begin(), w.frames.end(), sp.frames.data_ptr<float>()));
  CHECK(sp.frame_bytes() == 73.0 * 8 * 4);
  for (int64_t c = 0; c < 6; ++c) CHECK(sp.label[c].item<int64_t>() == w.labels[static_cast<std::size_t>(c)]);
  CHECK(sp.pad_value() == mel::silence_value(sp.info.mel_args()));
  CHECK(at::equal(sp.read_clips(2, 3), sp.frames.narrow(0, 8, 46)));
  CHECK_THROWS_AS(sp.read_clips(5, 2), InvalidArgument);
  CHECK_THROWS_AS(sp.read_clips(-1, 1), InvalidArgument);

  const int64_t cache = GENERATE(as<int64_t>{}, 1, 64 << 20);
  const trainer::Split streamed = trainer::open_split_streamed(d / "out/train.h5", "train", cache);
  REQUIRE(streamed.streamed());
  CHECK_FALSE(streamed.frames.defined());
  CHECK(at::equal(streamed.read_clips(0, 6), sp.frames));
  CHECK(at::equal(streamed.read_clips(3, 2), sp.read_clips(3, 2)));
  CHECK(streamed.read_clips(2, 0).size(0) == 0);
  CHECK_NOTHROW(streamed.check_all_finite());
  const trainer::Split bare = trainer::read_split(d / "out/train.h5", "train", false);
  CHECK_FALSE(bare.has_frames());
  CHECK_THROWS_AS(bare.read_clips(0, 1), InvalidArgument);
  const trainer::Dataset meta = trainer::load_dataset(d / "out", false);
  CHECK_FALSE(meta.train.frames.defined());
  CHECK(at::equal(meta.train.label, ds.train.label));
}

TEST_CASE("the views of a split: defaults by model and schema, flags given, and the example length",
          "[trainer][dataset][views]") {
  TempDir d;
  clip_dataset(d / "out", {27, 3, 12});
  const trainer::Split s3 = trainer::read_split(d / "out/train.h5", "train", false);
  const trainer::Split s1 = trainer::read_split(test::legacy_dataset(1) / "train.h5", "train", false);
  const data::views::ViewOptions defaults;
  const auto cnn = trainer::resolve_view_options(defaults, s3, "cnn");
  CHECK(cnn.view == "tiles");
  CHECK(cnn.tile_seconds == s3.info.short_seconds);
  CHECK(trainer::example_frames(cnn, s3) == 8);
  const auto ecapa = trainer::resolve_view_options(defaults, s3, "ecapa");
  CHECK(ecapa.view == "crops");
  CHECK(ecapa.crop_seconds == 2.0);
  CHECK(trainer::example_frames(ecapa, s3) == 200);
  CHECK(trainer::resolve_view_options(defaults, s1, "resnet-se").view == "tiles");
  CHECK(trainer::example_frames(trainer::resolve_view_options(defaults, s1, "cnn"), s1) == s1.info.n_frames);

  data::views::ViewOptions tiles2 = defaults;
  CHECK(trainer::resolve_view_options(tiles2, s3, "cnn", {"tile-seconds"}).tile_seconds == 2.0);
  CHECK(trainer::resolve_view_options(tiles2, s3, "cnn", {"epochs"}).tile_seconds == s3.info.short_seconds);
  tiles2.tile_seconds = 0.3;
  CHECK(trainer::resolve_view_options(tiles2, s3, "cnn").tile_seconds == 0.3);
  CHECK(trainer::resolve_view_options(tiles2, s3, "ecapa", {"tile-seconds"}).view == "crops");
  CHECK(trainer::example_frames(tiles2, s3) == 30);

  data::views::ViewOptions clips = defaults;
  clips.view = "clips";
  CHECK_THROWS_WITH(trainer::example_frames(clips, s3), Catch::Contains("--view clips"));
  CHECK_THROWS_WITH(trainer::split_view(s1, clips, false), Catch::Contains("schema-1"));
  const auto tiles_eval = trainer::split_view(s3, cnn, /*evaluation=*/true);
  const auto tiles_train = trainer::split_view(s3, cnn, /*evaluation=*/false);
  const std::vector<int64_t> counts = s3.clip_frame_counts();
  CHECK(tiles_eval->examples(counts, 0, 0).size() == 4 + 1 + 2);
  CHECK(tiles_train->examples(counts, 0, 0).size() == 3 + 1 + 2);
  const auto legacy = trainer::split_view(s1, trainer::resolve_view_options(defaults, s1, "cnn"), false);
  const auto examples = legacy->examples(s1.clip_frame_counts(), 0, 0);
  CHECK(static_cast<int64_t>(examples.size()) == s1.meta.valid_segments());
  for (const auto& e : examples) CHECK(e.real == e.length);
}

TEST_CASE("gather_examples lays out examples as a naive loop over the clips does", "[trainer][dataset][views]") {
  TempDir d;
  clip_dataset(d / "out", {30, 3, 12, 1});
  const bool streamed = GENERATE(false, true);
  CAPTURE(streamed);
  const trainer::Split s = streamed ? trainer::open_split_streamed(d / "out/train.h5", "train", 1 << 20)
                                    : trainer::read_split(d / "out/train.h5", "train");
  const trainer::Split ram = trainer::read_split(d / "out/train.h5", "train");
  const std::vector<data::views::Example> examples = {
      {.clip = 0, .start = 22, .length = 8, .real = 8, .clip_frames = 30},
      {.clip = 1, .start = 0, .length = 8, .real = 3, .clip_frames = 3},
      {.clip = 1, .start = 0, .length = 8, .real = 8, .clip_frames = 3, .repeat = true},
      {.clip = 3, .start = 0, .length = 8, .real = 1, .clip_frames = 1},
      {.clip = 2, .start = 8, .length = 8, .real = 4, .clip_frames = 12}};
  const int64_t out_length = GENERATE(0, 10);
  const trainer::ExampleBatch b = trainer::gather_examples(s, examples, out_length);
  const int64_t t = out_length > 0 ? out_length : 8;
  REQUIRE(b.x.sizes().vec() == std::vector<int64_t>{5, 8, t});
  const float pad = ram.pad_value();
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    CAPTURE(i);
    CHECK(b.lengths[static_cast<int64_t>(i)].item<int64_t>() == e.real);
    CHECK(b.clip[static_cast<int64_t>(i)].item<int64_t>() == e.clip);
    const int64_t base = ram.meta.frame_offset[static_cast<std::size_t>(e.clip)];
    for (int64_t k = 0; k < t; ++k)
      for (int64_t m = 0; m < 8; ++m) {
        const float want = k < e.real ? ram.frames[base + (e.start + k) % e.clip_frames][m].item<float>() : pad;
        REQUIRE(b.x[static_cast<int64_t>(i)][m][k].item<float>() == want);
      }
  }
  CHECK_THROWS_AS(trainer::gather_examples(s, examples, 5), InvalidArgument);
  const std::vector<data::views::Example> outside = {{.clip = 4, .start = 0, .length = 2, .real = 1, .clip_frames = 1}};
  CHECK_THROWS_AS(trainer::gather_examples(s, outside), InvalidArgument);
}

TEST_CASE("unknown split and class names are invalid arguments", "[trainer][dataset]") {
  TempDir d;
  builder::run_build(build(d, "out"));
  const auto ds = trainer::load_dataset(d / "out", false);
  CHECK_THROWS_AS(ds.split("valid"), InvalidArgument);
  try {
    ds.class_index("leak", "--positive-class");
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("--positive-class: 'leak' is not a class"));
    CHECK_THAT(msg, Catch::Contains("(classes: class0, class1, class2)"));
  }
}

TEST_CASE("empty splits load with zero files, and require_files names them", "[trainer][dataset]") {
  TempDir d;
  auto c = build(d, "out");
  c.build.split = "1,0,0";
  builder::run_build(c);
  const auto ds = trainer::load_dataset(d / "out");
  CHECK(ds.train.files() == 18);
  CHECK(ds.val.files() == 0);
  CHECK(ds.val.frames.sizes().vec() == std::vector<int64_t>{0, 32});
  CHECK(ds.val.total_frames() == 0);
  CHECK_NOTHROW(ds.require_files("train"));
  const std::string msg = format_error([&] { ds.require_files("test"); });
  CHECK_THAT(msg, Catch::Contains("split 'test'"));
  CHECK_THAT(msg, Catch::Contains("is empty"));
}

TEST_CASE("splits from different builds are refused, naming the difference", "[trainer][dataset]") {
  TempDir d;
  auto a = build(d, "a");
  builder::run_build(a);
  struct Variant {
    std::string name;
    std::function<void(builder::BuildConfig&)> change;
    std::string expect;
  };
  const std::vector<Variant> variants = {
      {"n_mels", [](auto& c) { c.mel.n_mels = 24; }, "n_mels is 32 in train.h5 but 24 in "},
      {"hop", [](auto& c) { c.mel.hop_length = 128; }, "hop_length is 64 in train.h5 but 128 in "},
      {"log", [](auto& c) { c.mel.log = mel::LogMode::ln; }, "log is db in train.h5 but ln in "},
      {"dtype", [](auto& c) { c.build.dtype = mel::DType::float32; }, "dtype is float16 in train.h5 but float32 in "},
  };
  const std::size_t i = GENERATE(range(0, 4));
  const std::string split = GENERATE(std::string("val"), std::string("test"));
  const auto& v = variants[i];
  CAPTURE(v.name, split);
  auto b = build(d, "b_" + v.name);
  v.change(b);
  builder::run_build(b);
  fs::create_directories(d / "mixed");
  for (const auto& s : trainer::kSplitNames) replace_file(d / "a" / (s + ".h5"), d / "mixed" / (s + ".h5"));
  replace_file(d / ("b_" + v.name) / (split + ".h5"), d / "mixed" / (split + ".h5"));
  CHECK_THAT(format_error([&] { trainer::load_dataset(d / "mixed", false); }),
             Catch::Contains(split + ".h5") && Catch::Contains("build_id"));
  strip_build_ids(d / "mixed");
  const std::string msg = format_error([&] { trainer::load_dataset(d / "mixed", false); });
  CHECK_THAT(msg, Catch::Contains(split + ".h5 does not match train.h5"));
  CHECK_THAT(msg, Catch::Contains(v.expect + split + ".h5"));
}

TEST_CASE("splits with different class names are refused", "[trainer][dataset]") {
  TempDir d;
  builder::run_build(build(d, "a"));
  fs::rename(d / "in/class2", d / "in/other");
  builder::run_build(build(d, "b"));
  replace_file(d / "b/val.h5", d / "a/val.h5");
  CHECK_THAT(format_error([&] { trainer::load_dataset(d / "a"); }), Catch::Contains("build_id"));
  strip_build_ids(d / "a");
  const std::string msg = format_error([&] { trainer::load_dataset(d / "a"); });
  CHECK_THAT(msg, Catch::Contains("val.h5 does not match train.h5: class names [class0, class1, other] vs "
                                  "[class0, class1, class2]"));
}

TEST_CASE("missing, misnamed and foreign split files are refused", "[trainer][dataset]") {
  TempDir d;
  builder::run_build(build(d, "out"));
  const fs::path out = d / "out";

  SECTION("no such folder") {
    CHECK_THROWS_AS(trainer::load_dataset(d / "nowhere"), IoError);
  }
  SECTION("a missing split") {
    fs::remove(out / "test.h5");
    CHECK_THAT(format_error([&] { trainer::load_dataset(out); }), Catch::Contains("has no test.h5"));
  }
  SECTION("a split file holding another split") {
    replace_file(out / "train.h5", out / "val.h5");
    CHECK_THAT(format_error([&] { trainer::load_dataset(out); }),
               Catch::Contains("val.h5: holds split 'train', expected 'val'"));
  }
  SECTION("a newer schema version") {
    {
      auto f = h5::open_file(out / "val.h5", true);
      h5::write_attribute_int64(f, "schema_version", 4);
    }
    const std::string msg = format_error([&] { trainer::load_dataset(out); });
    CHECK_THAT(msg, Catch::Contains("val.h5: schema_version 4 is not supported"));
    CHECK_THAT(msg, Catch::Contains("reads schema_version 1 to 3"));
  }
  SECTION("an HDF5 file that is not a melforge dataset") {
    h5::create_file(out / "test.h5").close();
    CHECK_THAT(format_error([&] { trainer::load_dataset(out); }),
               Catch::Contains("test.h5: no schema_version attribute"));
  }
  SECTION("a file that is not HDF5") {
    test::write_text(out / "train.h5", "not hdf5");
    CHECK_THROWS_AS(trainer::load_dataset(out), IoError);
  }
}

TEST_CASE("a split file that contradicts itself is refused", "[trainer][dataset]") {
  TempDir d;
  builder::run_build(build(d, "out"));
  const fs::path train = d / "out/train.h5";
  auto read = [&] { trainer::read_split(train, "train"); };
  REQUIRE_NOTHROW(read());
  const std::string files = std::to_string(trainer::read_split(train, "train", false).files());

  SECTION("a label outside the class names") {
    write_int32_dataset(train, "label", 3);
    CHECK_THAT(format_error(read), Catch::Contains("label[0] = 3 is outside the 3 class names"));
  }
  SECTION("a negative label") {
    write_int32_dataset(train, "label", -1);
    CHECK_THAT(format_error(read), Catch::Contains("label[0] = -1 is outside"));
  }
  SECTION("an unknown spelling of a parameter") {
    {
      auto f = h5::open_file(train, true);
      h5::write_attribute_string(f, "window", "triangle");
    }
    CHECK_THAT(format_error(read), Catch::Contains("attribute window = 'triangle' is not understood"));
  }
  SECTION("a missing parameter") {
    {
      auto f = h5::open_file(train, true);
      REQUIRE(H5Adelete(f.id(), "n_mels") >= 0);
    }
    CHECK_THAT(format_error(read), Catch::Contains("missing attribute 'n_mels'"));
  }
  SECTION("a non-positive size") {
    {
      auto f = h5::open_file(train, true);
      h5::write_attribute_int64(f, "n_mels", 0);
    }
    CHECK_THAT(format_error(read), Catch::Contains("n_mels = 0 must be > 0"));
  }
}

TEST_CASE("frames load in blocks of whole clips, polled before each, and a throwing poll abandons the load",
          "[trainer][dataset]") {
  TempDir d;
  clip_dataset(d / "out", {7, 1, 30, 12, 4, 19});
  trainer::StreamOptions off;
  off.stream = "off";
  const trainer::Dataset whole = trainer::load_dataset(d / "out", off);
  int64_t polls = 0;
  const trainer::Dataset blocks = trainer::load_dataset(d / "out", off, -1, [&] { ++polls; }, 1);
  CHECK(polls == 6 + 3 + 3);
  CHECK(at::equal(blocks.train.frames, whole.train.frames));
  CHECK(at::equal(blocks.val.frames, whole.val.frames));
  CHECK(at::equal(blocks.test.frames, whole.test.frames));
  int64_t block_polls = 0;
  trainer::load_dataset(d / "out", off, -1, [&] { ++block_polls; }, 20 * 8 * 4);
  CHECK(block_polls == 4 + 1 + 1);

  struct Abandon {};
  int64_t calls = 0;
  CHECK_THROWS_AS(trainer::load_dataset(d / "out", off, -1,
                                        [&] {
                                          if (++calls == 2) throw Abandon{};
                                        },
                                        1),
                  Abandon);
  CHECK(calls == 2);
}

TEST_CASE("a dataset larger than the RAM budget is refused before anything is loaded", "[trainer][dataset]") {
  TempDir d;
  clip_dataset(d / "out", {7, 1, 30, 12, 4, 19});
  const trainer::Dataset meta = trainer::load_dataset(d / "out", false);
  const auto need = static_cast<int64_t>(meta.train.frame_bytes() + meta.val.frame_bytes() + meta.test.frame_bytes());
  REQUIRE(need == (73 + 16 + 16) * 8 * 4);
  CHECK_THROWS_AS(trainer::load_dataset(d / "out", true, need - 1), Error);
  CHECK_THROWS_WITH(trainer::load_dataset(d / "out", true, need - 1),
                    Catch::Contains("MiB as float32") && Catch::Contains("--stream on"));
  const trainer::Dataset ds = trainer::load_dataset(d / "out", true, need);
  CHECK(ds.train.frames.defined());
  CHECK(trainer::available_memory_bytes() > 0);
}

}  // namespace melforge_test_trainer_dataset
