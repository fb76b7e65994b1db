// The trainer's dataset reader on datasets built by the builder library: data read back exactly, and every
// inconsistency between or inside the split files refused with a FormatError that names it.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <functional>

#include "data/dataset.h"
#include "h5_writer.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"
#include "trainer_fixture.h"

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

TEST_CASE("a built dataset reads back as float32 tensors equal to the stored data", "[trainer][dataset]") {
  const mel::DType dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  CAPTURE(mel::to_string(dtype));
  TempDir d;
  auto c = build(d, "out");
  c.build.dtype = dtype;
  builder::run_build(c);

  const trainer::Dataset ds = trainer::load_dataset(d / "out");
  CHECK(ds.class_names == std::vector<std::string>{"class0", "class1", "class2"});
  CHECK(ds.num_classes() == 3);
  CHECK(ds.info.n_mels == 32);
  CHECK(ds.info.n_frames == 1 + 2000 / 64);
  CHECK(ds.info.num_long == 2);
  CHECK(ds.info.num_short == 4);
  CHECK(ds.info.dtype == mel::to_string(dtype));
  CHECK(ds.info.to_json()["hop_length"].get<int64_t>() == 64);

  const mel::MelArgs m = ds.info.mel_args();
  CHECK(m.sample_rate == c.mel.sample_rate);
  CHECK(m.n_fft == c.mel.n_fft);
  CHECK(m.win() == c.mel.win());
  CHECK(m.hop() == c.mel.hop());
  CHECK(m.n_mels == c.mel.n_mels);
  CHECK(m.window == c.mel.window);
  CHECK(m.center == c.mel.center);
  CHECK(m.pad_mode == c.mel.pad_mode);
  CHECK(m.power == c.mel.power);
  CHECK(m.fmax() == c.mel.fmax());
  CHECK(m.mel_scale == c.mel.mel_scale);
  CHECK(m.mel_norm == c.mel.mel_norm);
  CHECK(m.log == c.mel.log);
  CHECK(m.amin == c.mel.amin);
  const segment::SegmentArgs s = ds.info.segment_args();
  CHECK(s.long_seconds == c.segment.long_seconds);
  CHECK(s.short_seconds == c.segment.short_seconds);
  CHECK(s.num_long == 2);
  CHECK(s.short_files == c.segment.short_files);

  const float silence = mel::silence_value(c.mel);
  int64_t total = 0;
  for (const auto& name : trainer::kSplitNames) {
    CAPTURE(name);
    const trainer::Split& sp = ds.split(name);
    auto f = h5::open_file(d / "out" / (name + ".h5"));
    auto mel = h5::open_dataset(f, "mel");
    const auto dims = h5::dims(mel);
    REQUIRE(sp.mel.defined());
    CHECK(sp.mel.scalar_type() == at::kFloat);
    CHECK(sp.mel.sizes().vec() == dims);
    CHECK(sp.label.scalar_type() == at::kLong);
    CHECK(sp.num_valid_long.scalar_type() == at::kLong);
    REQUIRE(sp.files() == dims[0]);
    REQUIRE(sp.files() > 0);
    total += sp.files();

    const auto expect = h5::read_float(mel);
    REQUIRE(static_cast<int64_t>(expect.size()) == sp.mel.numel());
    CHECK(std::equal(expect.begin(), expect.end(), sp.mel.data_ptr<float>()));
    const auto labels = h5::read_int32(f, "label");
    const auto valid = h5::read_int32(f, "num_valid_long");
    CHECK(sp.paths == h5::read_strings(f, "path"));
    int64_t valid_sum = 0;
    for (int64_t i = 0; i < sp.files(); ++i) {
      CHECK(sp.label[i].item<int64_t>() == labels[i]);
      CHECK(sp.num_valid_long[i].item<int64_t>() == valid[i]);
      CHECK(sp.paths[i].substr(0, 6) == "class" + std::to_string(labels[i]));
      valid_sum += valid[i];
      for (int64_t l = valid[i]; l < 2; ++l) CHECK((sp.mel[i][l] == silence).all().item<bool>());
      if (valid[i] > 0) CHECK_FALSE((sp.mel[i][0] == silence).all().item<bool>());
    }
    CHECK(sp.valid_segments() == valid_sum * 4);
  }
  CHECK(total == 3 * (5 + 1));
  CHECK_NOTHROW(ds.require_files("train"));
  CHECK(ds.class_index("class2", "--positive-class") == 2);

  const trainer::Dataset meta = trainer::load_dataset(d / "out", false);
  CHECK_FALSE(meta.train.mel.defined());
  CHECK(at::equal(meta.train.label, ds.train.label));
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
  CHECK(ds.val.mel.sizes().vec() == std::vector<int64_t>{0, 2, 4, 32, 32});
  CHECK(ds.val.valid_segments() == 0);
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
      {"num_long", [](auto& c) { c.segment.num_long = 3; }, "num_long is 2 in train.h5 but 3 in "},
  };
  const std::size_t i = GENERATE(range(0, 5));
  const std::string split = GENERATE(std::string("val"), std::string("test"));
  const auto& v = variants[i];
  CAPTURE(v.name, split);
  auto b = build(d, "b_" + v.name);
  v.change(b);
  builder::run_build(b);
  fs::create_directories(d / "mixed");
  for (const auto& s : trainer::kSplitNames) replace_file(d / "a" / (s + ".h5"), d / "mixed" / (s + ".h5"));
  replace_file(d / ("b_" + v.name) / (split + ".h5"), d / "mixed" / (split + ".h5"));
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
      h5::write_attribute_int64(f, "schema_version", 3);
    }
    const std::string msg = format_error([&] { trainer::load_dataset(out); });
    CHECK_THAT(msg, Catch::Contains("val.h5: schema_version 3 is not supported"));
    CHECK_THAT(msg, Catch::Contains("reads schema_version 1 to 2"));
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

  SECTION("attributes that do not match the mel shape") {
    {
      auto f = h5::open_file(train, true);
      h5::write_attribute_int64(f, "n_frames", 31);
    }
    CHECK_THAT(format_error(read), Catch::Contains("mel has shape [" + files + ", 2, 4, 32, 32], but the attributes "
                                                   "say [" + files + ", 2, 4, 32, 31]"));
  }
  SECTION("a label outside the class names") {
    write_int32_dataset(train, "label", 3);
    CHECK_THAT(format_error(read), Catch::Contains("label[0] = 3 is outside the 3 class names"));
  }
  SECTION("a negative label") {
    write_int32_dataset(train, "label", -1);
    CHECK_THAT(format_error(read), Catch::Contains("label[0] = -1 is outside"));
  }
  SECTION("num_valid_long outside [1, num_long]") {
    const int32_t bad = GENERATE(0, 3);
    write_int32_dataset(train, "num_valid_long", bad);
    CHECK_THAT(format_error(read), Catch::Contains("num_valid_long[0] = " + std::to_string(bad) +
                                                   " is outside [1, num_long = 2]"));
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
      h5::write_attribute_int64(f, "num_short", 0);
    }
    CHECK_THAT(format_error(read), Catch::Contains("num_short = 0 must be > 0"));
  }
}

TEST_CASE("a split that consistently claims 2^40 files is refused before its per-file datasets are read",
          "[trainer][dataset]") {
  TempDir d;
  builder::run_build(build(d, "out"));
  const fs::path train = d / "out/train.h5";
  {
    auto f = h5::open_file(train, true);
    std::vector<hsize_t> mel_dims;
    {
      auto mel = h5::open_dataset(f, "mel");
      for (const int64_t x : h5::dims(mel)) mel_dims.push_back(static_cast<hsize_t>(x));
    }
    const hsize_t claim = hsize_t{1} << 40;
    mel_dims[0] = claim;
    std::vector<hsize_t> chunk = mel_dims;
    chunk[0] = 1;
    const auto replace = [&](const char* name, const std::vector<hsize_t>& shape, hid_t type, hid_t dcpl) {
      REQUIRE(H5Ldelete(f.id(), name, H5P_DEFAULT) >= 0);
      const hid_t space = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
      const hid_t ds = H5Dcreate2(f.id(), name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      REQUIRE(ds >= 0);
      H5Dclose(ds);
      H5Sclose(space);
    };
    const hid_t chunked = H5Pcreate(H5P_DATASET_CREATE);
    REQUIRE(H5Pset_chunk(chunked, static_cast<int>(chunk.size()), chunk.data()) >= 0);
    replace("mel", mel_dims, H5T_IEEE_F32LE, chunked);
    H5Pclose(chunked);
    replace("label", {claim}, H5T_STD_I32LE, H5P_DEFAULT);
    replace("num_valid_long", {claim}, H5T_STD_I32LE, H5P_DEFAULT);
    const hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    replace("path", {claim}, str, H5P_DEFAULT);
    H5Tclose(str);
  }
  REQUIRE(fs::file_size(train) < (int64_t{64} << 20));
  const std::string what = format_error([&] { trainer::read_split(train, "train", false); });
  CHECK_THAT(what, Catch::Contains("claim 1099511627776 files") && Catch::Contains("MiB of memory available") &&
                       Catch::Contains("train.h5"));
  CHECK_THROWS_AS(trainer::load_dataset(d / "out", false), FormatError);
}

TEST_CASE("spectrograms load in blocks of whole chunks, polled before each, and a throwing poll abandons the load",
          "[trainer][dataset]") {
  TempDir d;
  builder::BuildConfig c = build(d, "out");
  c.build.files_per_chunk = 2;
  builder::run_build(c);
  trainer::StreamOptions off;
  off.stream = "off";
  const trainer::Dataset whole = trainer::load_dataset(d / "out", off);
  int64_t chunks = 0;
  for (const auto* s : {&whole.train, &whole.val, &whole.test}) {
    auto f = h5::open_file(s->path);
    const auto chunk = h5::chunk_dims(h5::open_dataset(f, "mel"));
    REQUIRE(!chunk.empty());
    chunks += (s->files() + chunk[0] - 1) / chunk[0];
  }
  int64_t polls = 0;
  const trainer::Dataset blocks = trainer::load_dataset(d / "out", off, -1, [&] { ++polls; }, 1);
  CHECK(polls == chunks);
  CHECK(polls > 3);
  CHECK(at::equal(blocks.train.mel, whole.train.mel));
  CHECK(at::equal(blocks.val.mel, whole.val.mel));
  CHECK(at::equal(blocks.test.mel, whole.test.mel));

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
  builder::run_build(build(d, "out"));
  const trainer::Dataset meta = trainer::load_dataset(d / "out", false);
  int64_t need = 0;
  for (const trainer::Split* s : {&meta.train, &meta.val, &meta.test}) {
    int64_t bytes = s->files() * static_cast<int64_t>(sizeof(float));
    for (const int64_t dim : s->info.file_shape()) bytes *= dim;
    need += bytes;
  }
  REQUIRE(need > 0);
  CHECK_THROWS_AS(trainer::load_dataset(d / "out", true, need - 1), Error);
  CHECK_THROWS_WITH(trainer::load_dataset(d / "out", true, need - 1),
                    Catch::Contains("MiB as float32") &&
                        Catch::Contains("--stream on"));
  const trainer::Dataset ds = trainer::load_dataset(d / "out", true, need);
  CHECK(ds.train.mel.defined());
  CHECK(trainer::available_memory_bytes() > 0);
}

}  // namespace melforge_test_trainer_dataset
