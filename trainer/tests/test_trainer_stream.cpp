// Streaming a split from its HDF5 file instead of holding it in RAM: the choice between RAM and streaming, an
// abandoned streamed epoch, evaluation and training on a streamed dataset. (The streamed reads and the windowed
// shuffle against the in-RAM data: test_trainer_clips.cpp and test_trainer_dataset.cpp.)
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <algorithm>
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

/// A tone dataset (3 classes x 6 files + a stereo file each) whose HDF5 chunks hold `frames_per_chunk` frames
/// (0: the builder's automatic choice).
fs::path chunked_dataset(const TempDir& d, int frames_per_chunk) {
  return test::build_tone_dataset(d.path(), 3, 6, "data-" + std::to_string(frames_per_chunk),
                                  [&](builder::BuildConfig& c) { c.build.frames_per_chunk = frames_per_chunk; });
}

trainer::StreamOptions streaming(const std::string& mode, int64_t cache_mib = 64) {
  trainer::StreamOptions s;
  s.stream = mode;
  s.h5_cache = cache_mib;
  return s;
}

/// Float32 bytes of the three splits' frames.
int64_t dataset_bytes(const fs::path& data) {
  const trainer::Dataset meta = trainer::load_dataset(data, false);
  return static_cast<int64_t>(meta.train.frame_bytes() + meta.val.frame_bytes() + meta.test.frame_bytes());
}

}  // namespace

TEST_CASE("stream on, off and auto place the frames in RAM or stream them, deciding before any read",
          "[trainer][stream]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 64);
  const int64_t need = dataset_bytes(data);
  REQUIRE(need > 0);

  const trainer::Dataset off = trainer::load_dataset(data, streaming("off"), need);
  CHECK(off.train.frames.defined());
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
      CHECK(at::equal(s.read_clips(0, s.files()), r.frames));
      CHECK(s.meta.frame_offset == r.meta.frame_offset);
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

TEST_CASE("an unfinished streamed epoch can be abandoned and restarted", "[trainer][stream][loader]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 16);
  const trainer::Split ram = trainer::read_split(data / "train.h5", "train");
  const trainer::Split streamed = trainer::open_split_streamed(data / "train.h5", "train", 1 << 20);
  trainer::LoaderOptions o;
  o.batch_size = 5;
  o.prefetch = 3;
  o.stream_window = 0.05;
  const auto view = trainer::split_view(ram, trainer::resolve_view_options({}, ram, "cnn"), false);
  trainer::BatchLoader loader(streamed, *view, ram.info.n_frames, o, 3, at::kCPU);
  loader.start_epoch(0);
  REQUIRE(loader.next().has_value());
  REQUIRE(loader.next().has_value());
  loader.start_epoch(4);
  std::vector<at::Tensor> xs;
  while (auto b = loader.next()) xs.push_back(b->x);
  const at::Tensor order = loader.epoch_order(4);
  const auto examples = loader.epoch_examples(4);
  std::vector<data::views::Example> ordered;
  for (int64_t i = 0; i < order.size(0); ++i) ordered.push_back(examples[static_cast<std::size_t>(order[i].item<int64_t>())]);
  CHECK(at::equal(at::cat(xs), trainer::gather_examples(ram, ordered, ram.info.n_frames).x));
  loader.stop();
  loader.stop();
}

TEST_CASE("evaluation of a streamed split equals the evaluation in RAM", "[trainer][stream][eval]") {
  TempDir d;
  const fs::path data = chunked_dataset(d, 16);
  const trainer::Split ram = trainer::read_split(data / "test.h5", "test");
  const trainer::Split streamed = trainer::open_split_streamed(data / "test.h5", "test", 1 << 20);
  trainer::ModelOptions mo;
  mo.hidden = 16;
  auto model = trainer::make_model(mo, ram.info, static_cast<int64_t>(ram.class_names.size()));
  trainer::EvalOptions eo;
  eo.view = trainer::resolve_view_options({}, ram, "cnn");
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
  const fs::path data = chunked_dataset(d, 16);
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
