// melforge_data (data/): SplitInfo and MelReader against the file as melforge::h5 reads it, and SegmentLoader's
// epochs: every valid segment once, the planned order, determinism in (seed, epoch) across prefetch depths,
// drop_last, and each chunk inflated once per shuffled epoch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "build_fixture.h"
#include "loader/segment_loader.h"
#include "melforge/common/errors.h"
#include "reader/mel_reader.h"
#include "reader/split_info.h"
#include "test_util.h"

namespace melforge_test_data_loader {

using namespace melforge;

namespace {

/// A built tone corpus (3 classes, 12 files each) with 2 files per chunk in `dtype`, built once per test run;
/// returns the output folder.
std::filesystem::path build_dataset(mel::DType dtype) {
  static test::TempDir d;
  const std::string name = dtype == mel::DType::float16 ? "out16" : "out32";
  if (std::filesystem::exists(d / name / "train.h5")) return d / name;
  if (!std::filesystem::exists(d / "in")) test::write_tone_corpus(d / "in", 3, 12);
  auto c = test::tone_build_config(d / "in", d / name);
  c.build.frames_per_chunk = 2;
  c.build.dtype = dtype;
  builder::run_build(c);
  return d / name;
}

/// The float32 [n_mels, n_frames] spectrogram of valid segment `position`, from the reference read.
std::vector<float> reference_segment(const test::SplitData& ref, const data::SplitInfo& info, int64_t position) {
  const data::SegmentRef r = data::segment_at(info.segment_offsets(), info.info.num_short, position);
  const int64_t per = info.info.n_mels * info.info.n_frames;
  const int64_t row = (r.file * info.info.num_long + r.long_index) * info.info.num_short + r.short_index;
  return {ref.frames.begin() + row * per, ref.frames.begin() + (row + 1) * per};
}

/// Every batch of `epoch`, concatenated: x, y, file.
struct Epoch {
  std::vector<float> x;
  std::vector<int64_t> y, file;
  int64_t batches = 0;
};

Epoch run_epoch(data::SegmentLoader& loader, int64_t epoch) {
  Epoch e;
  loader.start_epoch(epoch);
  while (auto b = loader.next()) {
    const int64_t per = loader.split().info.n_mels * loader.split().info.n_frames;
    e.x.insert(e.x.end(), b->x.begin(), b->x.begin() + b->size * per);
    e.y.insert(e.y.end(), b->y.begin(), b->y.begin() + b->size);
    e.file.insert(e.file.end(), b->file.begin(), b->file.begin() + b->size);
    CHECK(b->index == e.batches);
    ++e.batches;
  }
  return e;
}

}  // namespace

TEST_CASE("SplitInfo and MelReader read what the file holds", "[data]") {
  const auto dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  const auto out = build_dataset(dtype);
  const auto info = data::read_split_info(data::split_file(out, "train"), "train");
  const auto ref = test::read_split(out / "train.h5");
  REQUIRE(info.files() == static_cast<int64_t>(ref.path.size()));
  REQUIRE(info.files() > 4);
  CHECK(info.paths == ref.path);
  CHECK(info.class_names == ref.classes);
  CHECK(info.info.dtype == (dtype == mel::DType::float16 ? "float16" : "float32"));
  int64_t valid = 0;
  for (int64_t f = 0; f < info.files(); ++f) {
    CHECK(info.labels[static_cast<size_t>(f)] == ref.label[static_cast<size_t>(f)]);
    CHECK(info.num_valid_long[static_cast<size_t>(f)] >= 1);
    valid += info.num_valid_long[static_cast<size_t>(f)] * info.info.num_short;
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

TEST_CASE("SegmentLoader delivers every valid segment once per epoch in the planned order", "[data]") {
  const auto out = build_dataset(mel::DType::float16);
  const auto info = data::read_split_info(out / "train.h5", "train");
  const auto ref = test::read_split(out / "train.h5");
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
  data::SegmentLoader loader(info, o);
  CHECK(loader.in_memory() == (in_memory == 1));
  const int64_t n = loader.segments();
  REQUIRE(n == info.valid_segments());
  CHECK(loader.batches_per_epoch() == (n + 6) / 7);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const data::ShufflePlan plan = loader.plan(epoch);
    std::vector<int64_t> sorted = plan.order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    REQUIRE(sorted == all);
    if (!shuffle) CHECK(plan.order == all);
    const int64_t chunks_before = loader.chunks_read();
    const Epoch e = run_epoch(loader, epoch);
    REQUIRE(static_cast<int64_t>(e.y.size()) == n);
    CHECK(e.batches == loader.batches_per_epoch());
    const int64_t chunks = (info.files() + 1) / 2;
    CHECK(loader.chunks_read() - chunks_before == (in_memory == 1 && epoch > 0 ? 0 : chunks));
    const int64_t per = info.info.n_mels * info.info.n_frames;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = plan.order[static_cast<size_t>(i)];
      const auto r = data::segment_at(info.segment_offsets(), info.info.num_short, p);
      CHECK(e.file[static_cast<size_t>(i)] == r.file);
      CHECK(e.y[static_cast<size_t>(i)] == ref.label[static_cast<size_t>(r.file)]);
      const auto want = reference_segment(ref, info, p);
      CHECK(std::memcmp(e.x.data() + i * per, want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("SegmentLoader's order depends on seed and epoch only", "[data]") {
  const auto out = build_dataset(mel::DType::float32);
  const auto info = data::read_split_info(out / "train.h5", "train");
  auto run = [&](uint64_t seed, int64_t prefetch, int64_t epoch, int in_memory = 0) {
    data::LoaderOptions o;
    o.in_memory = in_memory;
    o.batch_size = 5;
    o.seed = seed;
    o.prefetch = prefetch;
    o.pool_chunks = 2;
    data::SegmentLoader loader(info, o);
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

TEST_CASE("SegmentLoader drop_last drops only the final partial batch", "[data]") {
  const auto out = build_dataset(mel::DType::float16);
  const auto info = data::read_split_info(out / "train.h5", "train");
  int64_t batch = GENERATE(3, 9);
  while (info.valid_segments() % batch == 0) ++batch;
  data::LoaderOptions o;
  o.batch_size = batch;
  o.drop_last = true;
  data::SegmentLoader loader(info, o);
  const int64_t n = loader.segments();
  REQUIRE(n % batch != 0);
  CHECK(loader.batches_per_epoch() == n / batch);
  const Epoch e = run_epoch(loader, 0);
  CHECK(static_cast<int64_t>(e.y.size()) == n / batch * batch);
  const data::ShufflePlan plan = loader.plan(0);
  for (int64_t i = 0; i < n / batch * batch; ++i) {
    const auto r = data::segment_at(info.segment_offsets(), info.info.num_short, plan.order[static_cast<size_t>(i)]);
    CHECK(e.file[static_cast<size_t>(i)] == r.file);
  }
}

TEST_CASE("SegmentLoader refuses bad options before reading", "[data]") {
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
  data::SplitInfo empty;
  empty.path = "/nonexistent/train.h5";
  empty.info.num_short = 1;
  CHECK_THROWS_AS(data::SegmentLoader(empty, data::LoaderOptions{}), FormatError);
}

}  // namespace melforge_test_data_loader
