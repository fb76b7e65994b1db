// Split files as untrusted input (issue 29): crafted with the HDF5 C API from a valid schema-3 split, each case must
// be refused by data::read_split_info and data::ClipReader with a FormatError (IoError for a missing source) naming
// the file and the field, before anything large is allocated or anything outside the dataset's folder is read.
// tools/make_hostile_h5.py crafts the same structures with h5py for the Python tests and the fuzz seeds.
#include <hdf5.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "clip_fixture.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "reader/clip_reader.h"
#include "reader/split_info.h"
#include "test_util.h"

namespace melforge_test_untrusted_h5 {

using namespace melforge;
namespace fs = std::filesystem;

namespace {

/// Clip lengths of the crafted splits.
const std::vector<int64_t> kClips = {3, 1, 4, 2};

/// test::write_clip_split at `path`, its folder created first.
test::ClipSplitData write_split(const fs::path& path, const test::ClipSplitSpec& spec) {
  fs::create_directories(path.parent_path());
  return test::write_clip_split(path, spec);
}

/// Removes the link `name` of the writable file `f`.
void unlink_dataset(const h5::File& f, const std::string& name) {
  if (H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) < 0) throw IoError("cannot delete " + name);
}

/// Replaces `frames` of the split at `path` by a virtual dataset of the same extent whose one source is `source`
/// (as stored) : `dataset`.
void make_virtual_frames(const fs::path& path, const std::string& source, const std::string& dataset = "/frames") {
  int64_t rows = 0;
  for (const int64_t c : kClips) rows += c;
  const auto f = h5::open_file(path, true);
  unlink_dataset(f, "frames");
  h5::create_virtual_dataset(f, "frames", H5T_IEEE_F32LE, {rows, 5}, {{source, dataset, 0, rows}}, 0.0).close();
}

/// Replaces dataset `name` by `count` fixed-length strings of `size` bytes each, written ("x" each) when `write`.
void make_fixed_strings(const fs::path& path, const std::string& name, size_t size, hsize_t count, bool write) {
  const auto f = h5::open_file(path, true);
  unlink_dataset(f, name);
  h5::Datatype type(H5Tcopy(H5T_C_S1), "type");
  H5Tset_size(type.id(), size);
  h5::Dataspace space(H5Screate_simple(1, &count, nullptr), "space");
  h5::Dataset ds(H5Dcreate2(f.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 name);
  if (!write) return;
  std::vector<char> data(size * count, 'x');
  if (H5Dwrite(ds.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) throw IoError("write " + name);
}

/// Replaces dataset `name` by `count` fixed-length 16-byte strings stored in the external file `external`.
void make_external_strings(const fs::path& path, const std::string& name, const fs::path& external) {
  const auto f = h5::open_file(path, true);
  unlink_dataset(f, name);
  const hsize_t count = 3;
  h5::Datatype type(H5Tcopy(H5T_C_S1), "type");
  H5Tset_size(type.id(), 16);
  h5::Dataspace space(H5Screate_simple(1, &count, nullptr), "space");
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE), "dcpl");
  if (H5Pset_external(dcpl.id(), external.c_str(), 0, 16 * count) < 0) throw IoError("H5Pset_external");
  h5::Dataset ds(H5Dcreate2(f.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT), name);
  if (!ds) throw IoError("cannot create " + name);
}

/// Replaces `frames` by a chunked dataset of the same extent whose chunks hold `chunk_rows` rows (nothing written).
void make_big_chunk_frames(const fs::path& path, int64_t chunk_rows) {
  int64_t rows = 0;
  for (const int64_t c : kClips) rows += c;
  const auto f = h5::open_file(path, true);
  unlink_dataset(f, "frames");
  h5::ChunkedSpec spec;
  spec.dims = {rows, 5};
  spec.max_dims = {-1, 5};
  spec.chunk = {chunk_rows, 5};
  h5::create_chunked_dataset(f, "frames", H5T_IEEE_F32LE, spec).close();
}

/// Writes the root attribute build_id of the split at `path`.
void set_build_id(const fs::path& path, const std::string& id) {
  const auto f = h5::open_file(path, true);
  h5::write_attribute_string(f, "build_id", id);
}

/// One crafted file: its name, how it is made from a valid train.h5 in `dir`, and what the error must say.
struct HostileCase {
  std::string name;
  std::function<void(const test::TempDir& dir)> craft;
  std::vector<std::string> message;
  /// True when the error is an IoError (a missing source), else a FormatError.
  bool io_error = false;
};

std::vector<HostileCase> hostile_cases() {
  const test::ClipSplitSpec spec{.clip_frames = kClips};
  return {
      {"external storage: a regular file",
       [](const test::TempDir& d) {
         test::write_text(d / "secret.txt", "root:x:0:0:root:/root:/bin/bash\nsecret\n");
         make_external_strings(d / "data" / "train.h5", "class_names", d / "secret.txt");
       },
       {"train.h5:/class_names", "external storage"}},
      {"external storage: a FIFO",
       [](const test::TempDir& d) {
         REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
         make_external_strings(d / "data" / "train.h5", "path", d / "fifo");
       },
       {"train.h5:/path", "external storage"}},
      {"virtual source in a sibling folder",
       [spec](const test::TempDir& d) {
         write_split(d / "outside" / "src.h5", spec);
         make_virtual_frames(d / "data" / "train.h5", "../outside/src.h5");
       },
       {"train.h5:/frames", "'../outside/src.h5'", "outside the dataset's folder"}},
      {"virtual source by absolute path",
       [spec](const test::TempDir& d) {
         write_split(d / "outside" / "src.h5", spec);
         make_virtual_frames(d / "data" / "train.h5", (d / "outside" / "src.h5").string());
       },
       {"train.h5:/frames", "outside/src.h5'", "outside the dataset's folder"}},
      {"virtual source through a symbolic link",
       [spec](const test::TempDir& d) {
         write_split(d / "outside" / "src.h5", spec);
         fs::create_directory_symlink(d / "outside", d / "data" / "sources");
         make_virtual_frames(d / "data" / "train.h5", "sources/src.h5");
       },
       {"train.h5:/frames", "'sources/src.h5'", "outside the dataset's folder"}},
      {"virtual source missing in the folder",
       [](const test::TempDir& d) { make_virtual_frames(d / "data" / "train.h5", "sources/absent.h5"); },
       {"train.h5:/frames", "'sources/absent.h5'", "missing"},
       true},
      {"virtual dataset that names itself",
       [](const test::TempDir& d) { make_virtual_frames(d / "data" / "train.h5", "."); },
       {"train.h5:/frames", "more than 4 deep"}},
      {"two splits that name each other",
       [spec](const test::TempDir& d) {
         test::ClipSplitSpec val = spec;
         val.split = "val";
         write_split(d / "data" / "val.h5", val);
         make_virtual_frames(d / "data" / "val.h5", "train.h5");
         make_virtual_frames(d / "data" / "train.h5", "val.h5");
       },
       {"train.h5:/frames", "more than 4 deep"}},
      {"1 GiB fixed-length class names, not stored",
       [](const test::TempDir& d) {
         make_fixed_strings(d / "data" / "train.h5", "class_names", size_t{1} << 30, 1, false);
       },
       {"train.h5:/class_names"}},
      {"100 KiB fixed-length paths, stored",
       [](const test::TempDir& d) {
         make_fixed_strings(d / "data" / "train.h5", "path", size_t{100} << 10, kClips.size(), true);
       },
       {"train.h5:/path", "more than the 64 KiB"}},
      {"a 2.5 GiB chunk",
       [](const test::TempDir& d) { make_big_chunk_frames(d / "data" / "train.h5", int64_t{1} << 27); },
       {"train.h5:/frames", "chunks hold 2560 MiB"}},
      {"a huge targets matrix of fill values",
       [](const test::TempDir& d) {
         test::replace_by_empty_claim(d / "data" / "train.h5", "targets", H5T_STD_U8LE,
                                      {static_cast<int64_t>(kClips.size()), int64_t{1} << 36});
       },
       {"train.h5:/targets", "not allocated"}},
      {"targets rows disagree with the clips",
       [](const test::TempDir& d) {
         const auto f = h5::open_file(d / "data" / "train.h5", true);
         h5::write_uint8_matrix(f, "targets", 2, 3, std::vector<uint8_t>{1, 0, 0, 0, 1, 0});
       },
       {"train.h5: targets has shape [2, 3], expected [4, 3]"}},
      {"frame_offset longer than frames has rows",
       [](const test::TempDir& d) {
         test::replace_int_dataset(d / "data" / "train.h5", "frame_offset", H5T_STD_I64LE,
                                   std::vector<int64_t>(20, 0));
       },
       {"train.h5: frame_offset has shape [20]"}},
      {"splits of two builds",
       [spec](const test::TempDir& d) {
         test::ClipSplitSpec val = spec;
         val.split = "val";
         write_split(d / "data" / "val.h5", val);
         set_build_id(d / "data" / "train.h5", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
         set_build_id(d / "data" / "val.h5", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
       },
       {"train.h5 (build_id 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa')",
        "val.h5 (build_id 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb')", "different melforge-build runs"}},
      {"a 64 MiB split attribute",
       [](const test::TempDir& d) {
         const auto f = h5::open_file(d / "data" / "train.h5", true);
         h5::write_attribute_string(f, "split", std::string(size_t{64} << 20, '\x1b'));
       },
       {"train.h5 attribute 'split'", "more than the 64 KiB"}},
  };
}

}  // namespace

TEST_CASE("crafted split files are refused naming the file and the field, before allocating", "[untrusted][h5]") {
  const auto cases = hostile_cases();
  const auto index = GENERATE_COPY(range(std::size_t{0}, cases.size()));
  const HostileCase& c = cases[index];
  CAPTURE(c.name);
  test::TempDir dir;
  write_split(dir / "data" / "train.h5", test::ClipSplitSpec{.clip_frames = kClips});
  c.craft(dir);
  const fs::path train = dir / "data" / "train.h5";
  std::string message;
  try {
    data::read_split_info(train, "train");
    FAIL("read_split_info accepted the file");
  } catch (const FormatError& e) {
    CHECK_FALSE(c.io_error);
    message = e.what();
  } catch (const IoError& e) {
    CHECK(c.io_error);
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(train.string()) != std::string::npos);
  for (const std::string& part : c.message) CHECK(message.find(part) != std::string::npos);
  CHECK(message.size() < 2000);
  CHECK(message.find('\x1b') == std::string::npos);
}

TEST_CASE("ClipReader refuses frames whose virtual source is outside the folder", "[untrusted][clip_reader]") {
  test::TempDir dir;
  const test::ClipSplitSpec spec{.clip_frames = kClips};
  write_split(dir / "data" / "train.h5", spec);
  const data::SplitInfo info = data::read_split_info(dir / "data" / "train.h5", "train");
  write_split(dir / "outside" / "src.h5", spec);
  make_virtual_frames(dir / "data" / "train.h5", "../outside/src.h5");
  CHECK_THROWS_AS(data::ClipReader(info, 1 << 20), FormatError);
  CHECK_THROWS_WITH(data::ClipReader(info, 1 << 20), Catch::Contains("train.h5:/frames") &&
                                                         Catch::Contains("outside the dataset's folder"));
}

TEST_CASE("virtual sources inside the folder, and splits without a build_id, are read", "[untrusted][clip_reader]") {
  test::TempDir dir;
  const test::ClipSplitSpec spec{.clip_frames = kClips};
  const auto written = write_split(dir / "data" / "sources" / "src.h5", spec);
  write_split(dir / "data" / "train.h5", spec);
  make_virtual_frames(dir / "data" / "train.h5", "sources/src.h5");
  test::ClipSplitSpec val = spec;
  val.split = "val";
  write_split(dir / "data" / "val.h5", val);
  const bool same_id = GENERATE(false, true);
  if (same_id) {
    set_build_id(dir / "data" / "train.h5", "0123456789abcdef0123456789abcdef");
    set_build_id(dir / "data" / "val.h5", "0123456789abcdef0123456789abcdef");
  }
  const data::SplitInfo info = data::read_split_info(dir / "data" / "train.h5", "train");
  CHECK(info.build_id == (same_id ? "0123456789abcdef0123456789abcdef" : ""));
  CHECK(data::read_build_id(dir / "data" / "val.h5") == info.build_id);
  const data::ClipReader reader(info, 1 << 20);
  std::vector<float> frames(static_cast<std::size_t>(info.total_frames() * 5));
  reader.read_clips(0, info.files(), frames.data());
  CHECK(frames == written.frames);
}

}  // namespace melforge_test_untrusted_h5
