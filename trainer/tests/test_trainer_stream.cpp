// Streaming a split from its HDF5 file instead of holding it in RAM: the reader against the in-RAM load, the
// choice between RAM and streaming, the windowed shuffle of the loader (coverage, locality, data equal to the
// in-RAM data for the same order), evaluation and training on a streamed dataset.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <algorithm>
#include <random>
#include <set>
#include <sstream>

#include "data/dataset.h"
#include "data/loader.h"
#include "eval/evaluate.h"
#include "melforge/common/errors.h"
#include "models/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_stream {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A tone dataset (3 classes x 6 files + a stereo file each) whose HDF5 chunks hold `files_per_chunk` files
/// (0: the builder's automatic choice).
fs::path chunked_dataset(const TempDir& d, int files_per_chunk) {
  return test::build_tone_dataset(d.path(), 3, 6, "data-" + std::to_string(files_per_chunk),
                                  [&](builder::BuildConfig& c) { c.build.files_per_chunk = files_per_chunk; });
}

trainer::StreamOptions streaming(const std::string& mode, int64_t cache_mib = 64) {
  trainer::StreamOptions s;
  s.stream = mode;
  s.h5_cache = cache_mib;
  return s;
}

/// Float32 bytes of the three splits' spectrograms, by their shapes.
int64_t dataset_bytes(const fs::path& data) {
  const trainer::Dataset meta = trainer::load_dataset(data, false);
  int64_t need = 0;
  for (const trainer::Split* s : {&meta.train, &meta.val, &meta.test}) {
    int64_t bytes = s->files() * static_cast<int64_t>(sizeof(float));
    for (const int64_t dim : s->info.file_shape()) bytes *= dim;
    need += bytes;
  }
  return need;
}

/// The data of the segments at valid-segment positions `positions` of an in-RAM split, by naive loops over its
/// files and long segments: [n, M, T].
at::Tensor reference_segments(const trainer::Split& ram, const std::vector<int64_t>& positions) {
  std::vector<at::Tensor> all;
  for (int64_t f = 0; f < ram.files(); ++f)
    for (int64_t l = 0; l < ram.num_valid_long[f].item<int64_t>(); ++l)
      for (int64_t s = 0; s < ram.info.num_short; ++s) all.push_back(ram.mel[f][l][s]);
  std::vector<at::Tensor> out;
  for (const int64_t p : positions) out.push_back(all.at(static_cast<size_t>(p)));
  return at::stack(out);
}

/// The file of each valid-segment position, by naive loops.
std::vector<int64_t> file_of_positions(const trainer::Split& s) {
  std::vector<int64_t> file;
  for (int64_t f = 0; f < s.files(); ++f)
    for (int64_t i = 0; i < s.num_valid_long[f].item<int64_t>() * s.info.num_short; ++i) file.push_back(f);
  return file;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("a streamed split reads any range of files exactly as the in-RAM load", "[trainer][stream]") {
  TempDir d;
  const int files_per_chunk = GENERATE(1, 3, 0);
  const int64_t cache_mib = GENERATE(as<int64_t>{}, 1, 64);
  CAPTURE(files_per_chunk, cache_mib);
  const fs::path data = chunked_dataset(d, files_per_chunk);
  const trainer::Split ram = trainer::read_split(data / "train.h5", "train");
  const trainer::Split streamed = trainer::open_split_streamed(data / "train.h5", "train", cache_mib << 20);
  REQUIRE(streamed.streamed());
  REQUIRE_FALSE(streamed.mel.defined());
  REQUIRE(ram.files() >= 8);
  if (files_per_chunk > 0) CHECK(streamed.files_per_chunk() == files_per_chunk);
  CHECK(streamed.reader->cache_bytes() >= cache_mib << 20);
  CHECK(at::equal(streamed.read_files(0, streamed.files()), ram.mel));
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    const int64_t first = std::uniform_int_distribution<int64_t>(0, ram.files() - 1)(rng);
    const int64_t count = std::uniform_int_distribution<int64_t>(0, ram.files() - first)(rng);
    CAPTURE(first, count);
    CHECK(at::equal(streamed.read_files(first, count), ram.mel.narrow(0, first, count)));
  }
  CHECK_THROWS_AS(streamed.read_files(ram.files() - 1, 2), InvalidArgument);
  CHECK_THROWS_AS(streamed.read_files(-1, 1), InvalidArgument);
  const trainer::Split bare = trainer::read_split(data / "train.h5", "train", false);
  CHECK_FALSE(bare.has_mel());
  CHECK_THROWS_AS(bare.read_files(0, 1), InvalidArgument);
}

TEST_CASE("stream on, off and auto place the spectrograms in RAM or stream them, deciding before any read",
          "[trainer][stream]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 2);
  const int64_t need = dataset_bytes(data);
  REQUIRE(need > 0);

  const trainer::Dataset off = trainer::load_dataset(data, streaming("off"), need);
  CHECK(off.train.mel.defined());
  CHECK_FALSE(off.train.streamed());
  CHECK_THROWS_WITH(trainer::load_dataset(data, streaming("off"), need - 1),
                    Catch::Contains("MiB as float32") && Catch::Contains("--stream on"));

  const trainer::Dataset on = trainer::load_dataset(data, streaming("on"), need);
  const trainer::Dataset automatic_fits = trainer::load_dataset(data, streaming("auto"), need);
  const trainer::Dataset automatic_streams = trainer::load_dataset(data, streaming("auto"), need - 1);
  CHECK_FALSE(automatic_fits.train.streamed());
  for (const trainer::Dataset* ds : {&on, &automatic_streams}) {
    for (const std::string& name : trainer::kSplitNames) {
      const trainer::Split& s = ds->split(name);
      const trainer::Split& r = off.split(name);
      CAPTURE(name);
      CHECK(s.streamed());
      CHECK(at::equal(s.read_files(0, s.files()), r.mel));
      CHECK(at::equal(s.num_valid_long, r.num_valid_long));
      CHECK(at::equal(s.label, r.label));
    }
  }
  CHECK_THROWS_AS(trainer::load_dataset(data, streaming("sometimes")), InvalidArgument);
  CHECK_THROWS_AS(trainer::load_dataset(data, streaming("on", 0)), InvalidArgument);

  const trainer::Split val_on = trainer::load_split(data / "val.h5", "val", streaming("auto"), 0);
  CHECK(val_on.streamed());
  const trainer::Split val_ram = trainer::load_split(data / "val.h5", "val", streaming("auto"));
  CHECK_FALSE(val_ram.streamed());
  CHECK_THROWS_WITH(trainer::load_split(data / "val.h5", "val", streaming("off"), 0), Catch::Contains("--stream on"));
}

TEST_CASE("a streamed epoch visits every valid segment once, window by window, with the in-RAM data",
          "[trainer][stream][loader]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 2);
  const trainer::Split ram = trainer::read_split(data / "train.h5", "train");
  const trainer::Split streamed = trainer::open_split_streamed(data / "train.h5", "train", 1 << 20);
  const double block_mib = 2.0 * 2 * 4 * 32 * 32 * 4 / (1 << 20);
  const auto [window_mib, blocks_per_window] =
      GENERATE_COPY(table<double, int64_t>({{0.001, 1}, {2.5 * block_mib, 2}, {1000.0, 0}}));
  const int64_t batch = GENERATE(1, 7, 64);
  const int64_t prefetch = GENERATE(0, 2);
  CAPTURE(window_mib, batch, prefetch);
  trainer::LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  o.stream_window = window_mib;
  trainer::BatchLoader loader(streamed, o, 11, at::kCPU);
  const int64_t n = ram.valid_segments();
  REQUIRE(loader.segments() == n);
  CHECK(loader.block_files() == 2);
  const int64_t blocks = (ram.files() + 1) / 2;
  CHECK(loader.window_blocks() == (blocks_per_window > 0 ? blocks_per_window : blocks));

  const std::vector<int64_t> file = file_of_positions(ram);
  for (int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    const std::vector<int64_t> order = to_vector(loader.epoch_order(epoch));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    REQUIRE(sorted == identity);
    CHECK(to_vector(loader.epoch_order(epoch)) == order);

    const std::vector<int64_t> bounds = loader.window_bounds(epoch);
    REQUIRE(bounds.front() == 0);
    REQUIRE(bounds.back() == n);
    CHECK(static_cast<int64_t>(bounds.size()) - 1 == (blocks + loader.window_blocks() - 1) / loader.window_blocks());
    std::set<int64_t> seen_blocks;
    for (size_t w = 0; w + 1 < bounds.size(); ++w) {
      std::set<int64_t> window_blocks;
      for (int64_t i = bounds[w]; i < bounds[w + 1]; ++i) window_blocks.insert(file[order[i]] / 2);
      CHECK(static_cast<int64_t>(window_blocks.size()) <= loader.window_blocks());
      for (const int64_t b : window_blocks) CHECK(seen_blocks.insert(b).second);
    }

    loader.start_epoch(epoch);
    std::vector<at::Tensor> xs, ys;
    int64_t expected_index = 0;
    while (auto b = loader.next()) {
      CHECK(b->index == expected_index++);
      xs.push_back(b->x);
      ys.push_back(b->y);
    }
    CHECK(expected_index == loader.batches_per_epoch());
    CHECK(at::equal(at::cat(xs), reference_segments(ram, order)));
    std::vector<int64_t> labels;
    for (const int64_t p : order) labels.push_back(ram.label[file[p]].item<int64_t>());
    CHECK(to_vector(at::cat(ys)) == labels);

    const at::Tensor some = loader.epoch_order(epoch).narrow(0, 0, std::min<int64_t>(n, 9));
    CHECK(at::equal(loader.gather(some, 0).x, reference_segments(ram, to_vector(some))));
  }
  CHECK(to_vector(loader.epoch_order(0)) != to_vector(loader.epoch_order(1)));
}

TEST_CASE("an unfinished streamed epoch can be abandoned and restarted", "[trainer][stream][loader]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 1);
  const trainer::Split ram = trainer::read_split(data / "train.h5", "train");
  const trainer::Split streamed = trainer::open_split_streamed(data / "train.h5", "train", 1 << 20);
  trainer::LoaderOptions o;
  o.batch_size = 5;
  o.prefetch = 3;
  o.stream_window = 0.05;
  trainer::BatchLoader loader(streamed, o, 3, at::kCPU);
  loader.start_epoch(0);
  REQUIRE(loader.next().has_value());
  REQUIRE(loader.next().has_value());
  loader.start_epoch(4);
  std::vector<at::Tensor> xs;
  while (auto b = loader.next()) xs.push_back(b->x);
  CHECK(at::equal(at::cat(xs), reference_segments(ram, to_vector(loader.epoch_order(4)))));
  loader.stop();
  loader.stop();
}

TEST_CASE("evaluation of a streamed split equals the evaluation in RAM", "[trainer][stream][eval]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 2);
  const trainer::Split ram = trainer::read_split(data / "test.h5", "test");
  const trainer::Split streamed = trainer::open_split_streamed(data / "test.h5", "test", 1 << 20);
  trainer::ModelOptions mo;
  mo.hidden = 16;
  auto model = trainer::make_model(mo, ram.info, static_cast<int64_t>(ram.class_names.size()));
  trainer::EvalOptions eo;
  eo.batch_size = GENERATE(8, 1000);
  CAPTURE(eo.batch_size);
  const trainer::EvalResult a = trainer::evaluate(*model, ram, 1, 1.0, eo, at::kCPU);
  const trainer::EvalResult b = trainer::evaluate(*model, streamed, 1, 1.0, eo, at::kCPU);
  CHECK(at::equal(a.files.class_probs, b.files.class_probs));
  CHECK(at::equal(a.files.predicted, b.files.predicted));
  CHECK(at::equal(a.files.detection_score, b.files.detection_score));
  CHECK(a.segment.loss == b.segment.loss);
  CHECK(a.segment.accuracy == b.segment.accuracy);
  CHECK(a.file.accuracy == b.file.accuracy);
}

TEST_CASE("training on a streamed dataset learns, records the mode, and resumes exactly", "[trainer][stream][train]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 2);
  std::ostringstream log;
  const auto config = [&](const fs::path& out, int64_t epochs) {
    trainer::TrainConfig c = test::tiny_config(data, out, epochs);
    c.data.stream = streaming("on", 1);
    c.loader.stream_window = 0.2;
    return c;
  };
  const trainer::TrainResult full = trainer::train(config(d / "straight", 6), log);
  REQUIRE(full.test.has_value());
  CHECK(full.test->file.accuracy >= 0.9);
  CHECK(full.epochs_done == 6);

  auto first = config(d / "pieces", 6);
  trainer::TrainHooks stop;
  stop.on_epoch_end = [](int64_t epoch) { return epoch < 2; };
  CHECK(trainer::train(first, log, stop).interrupted);
  trainer::TrainConfig resume;
  resume.train.resume = d / "pieces";
  resume.runtime.threads = 2;
  resume.runtime.log_level = "warn";
  CHECK(trainer::train(resume, log).epochs_done == 6);
  const auto a = trainer::load_checkpoint(d / "straight" / "checkpoints/last.pt");
  const auto b = trainer::load_checkpoint(d / "pieces" / "checkpoints/last.pt");
  REQUIRE(a.model.size() == b.model.size());
  for (const auto& [name, t] : a.model) {
    INFO(name);
    CHECK(at::equal(t, b.model.at(name)));
  }
  CHECK(a.config["stream"]["stream"] == "on");

  auto ram = config(d / "ram", 1);
  ram.data.stream = streaming("auto");
  trainer::train(ram, log);
  const auto c = trainer::load_checkpoint(d / "ram" / "checkpoints/last.pt");
  CHECK(c.config["stream"]["stream"] == "off");
  CHECK(at::equal(c.model.at("input_mean"), a.model.at("input_mean")));
  CHECK(at::equal(c.model.at("input_std"), a.model.at("input_std")));
}

}  // namespace melforge_test_trainer_stream
