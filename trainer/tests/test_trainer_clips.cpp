// Training on clips stored whole (issue 28): a tile that is mostly padding reaches the loss with its real frames
// only, random crops resume bit-exactly in a whole run, schema-3 splits in RAM and streamed give the same batches,
// and the committed schema-1/2 datasets still train and learn.
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <torch/torch.h>

#include "catch_torch.h"

#include <sstream>

#include "clip_fixture.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "models/model.h"
#include "options.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "trainer_fixture.h"
#include "views/view.h"
#include "views/view_options.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_clips {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A schema-3 dataset of random frames (tests/clip_fixture.h: 16 kHz, hop 160, 100 frames a second, 8 mels,
/// default tile 0.08 s) whose train split has clips of `train_frames` frames; val and test get a few clips each.
fs::path clip_dataset(const fs::path& dir, const std::vector<int64_t>& train_frames) {
  fs::create_directories(dir);
  for (const std::string split : {"train", "val", "test"}) {
    test::ClipSplitSpec spec;
    spec.split = split;
    spec.n_mels = 8;
    spec.chunk_rows = 16;
    spec.clip_frames = split == "train" ? train_frames : std::vector<int64_t>{30, 3, 17, 45, 9, 26};
    test::write_clip_split(dir / (split + ".h5"), spec);
  }
  return dir;
}

/// The loss of `model` (eval mode) on `x` [B, M, T] with `lengths`, the detection head on class 0.
at::Tensor eval_loss(trainer::Classifier& model, const at::Tensor& x, const at::Tensor& lengths, const at::Tensor& y) {
  const trainer::ModelOutput out = model.forward(x, lengths);
  return trainer::combined_loss(out, y, 0, 1.0, at::ones({1}));
}

/// The gradient of every parameter of `model` after backward of `loss` (zeroed first).
std::vector<at::Tensor> gradients(trainer::Classifier& model, const at::Tensor& loss) {
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  loss.backward();
  std::vector<at::Tensor> out;
  for (auto& p : model.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return out;
}

}  // namespace

TEST_CASE("a tile that is mostly padding reaches the loss and the gradient with its real frames only",
          "[trainer][clips]") {
  TempDir d;
  const fs::path data = clip_dataset(d / "data", {2, 40, 3, 25});
  const trainer::Split split = trainer::read_split(data / "train.h5", "train");
  data::views::ViewOptions vo = trainer::resolve_view_options({}, split, "cnn");
  REQUIRE(vo.view == "tiles");
  REQUIRE(vo.tile_seconds == 0.08);
  const auto view = trainer::split_view(split, vo, /*evaluation=*/false);
  trainer::LoaderOptions lo;
  lo.batch_size = 64;
  lo.prefetch = 0;
  trainer::BatchLoader loader(split, *view, 8, lo, 1, at::kCPU);
  loader.start_epoch(0);
  const trainer::Batch b = *loader.next();
  REQUIRE_FALSE(loader.next().has_value());
  REQUIRE(b.x.size(2) == 8);
  int64_t row = -1;
  for (int64_t i = 0; i < b.x.size(0); ++i)
    if (b.clip[i].item<int64_t>() == 0) row = i;
  REQUIRE(row >= 0);
  CHECK(b.lengths[row].item<int64_t>() == 2);
  for (int64_t i = 0; i < b.x.size(0); ++i) {
    const int64_t frames = split.clip_frames(b.clip[i].item<int64_t>());
    if (frames >= 8)
      CHECK(b.lengths[i].item<int64_t>() >= 4);
    else
      CHECK(b.lengths[i].item<int64_t>() == frames);
  }

  const std::string model_name = GENERATE(std::string("cnn"), std::string("crnn"));
  CAPTURE(model_name);
  trainer::ModelOptions mo;
  mo.model = model_name;
  mo.hidden = 16;
  trainer::MelInfo info = split.info;
  info.n_frames = 8;
  torch::manual_seed(3);
  const auto model = trainer::make_model(mo, info, 3);
  model->set_input_normalization(-50.0, 29.0);
  model->eval();
  const at::Tensor x = b.x.narrow(0, row, 1), len = b.lengths.narrow(0, row, 1), y = b.y.narrow(0, row, 1);
  const at::Tensor padded_loss = eval_loss(*model, x, len, y);
  const std::vector<at::Tensor> padded_grad = gradients(*model, padded_loss);
  const at::Tensor real_loss = eval_loss(*model, x.narrow(2, 0, 2).contiguous(), at::Tensor(), y);
  const std::vector<at::Tensor> real_grad = gradients(*model, real_loss);
  at::Tensor other = x.clone();
  other.narrow(2, 2, 6).fill_(37.0f);
  const at::Tensor other_loss = eval_loss(*model, other, len, y);
  const std::vector<at::Tensor> other_grad = gradients(*model, other_loss);
  CHECK(padded_loss.item<double>() == Approx(real_loss.item<double>()).epsilon(1e-5));
  CHECK(other_loss.item<double>() == Approx(real_loss.item<double>()).epsilon(1e-5));
  for (std::size_t i = 0; i < real_grad.size(); ++i) {
    CAPTURE(i);
    CHECK(at::allclose(padded_grad[i], real_grad[i], 1e-4, 1e-6));
    CHECK(at::allclose(other_grad[i], real_grad[i], 1e-4, 1e-6));
  }
}

TEST_CASE("random crops in a whole run: a resumed run ends with the weights of an uninterrupted one",
          "[trainer][clips][crops][resume]") {
  TempDir d;
  const fs::path data = clip_dataset(d / "data", {40, 12, 33, 70, 5, 28, 51, 19, 44, 60, 8, 36});
  std::ostringstream log;
  auto straight = test::tiny_config(data, d / "straight", 3);
  straight.view.view = "crops";
  straight.view.crop_seconds = 0.1;
  straight.loader.batch_size = 4;
  straight.augment.time_masks = 1;
  straight.augment.time_width = 3;
  const trainer::TrainResult full = trainer::train(straight, log);
  const nlohmann::json config = test::read_json(d / "straight" / "config.json");
  CHECK(config["view"]["view"] == "crops");
  CHECK(config["view"]["crop_seconds"] == 0.1);
  CHECK(config["view"]["resolved"] == true);
  CHECK(config["model_config"]["n_frames"] == 10);

  auto first = straight;
  first.train.out = d / "pieces";
  trainer::TrainHooks stop_after_one;
  stop_after_one.on_epoch_end = [](int64_t epoch) { return epoch < 0; };
  CHECK(trainer::train(first, log, stop_after_one).epochs_done == 1);
  trainer::TrainConfig resume;
  resume.train.resume = d / "pieces";
  resume.runtime.threads = 2;
  resume.runtime.log_level = "warn";
  CHECK(trainer::train(resume, log).epochs_done == 3);
  const auto a = trainer::load_checkpoint(d / "straight" / "checkpoints/last.pt");
  const auto b = trainer::load_checkpoint(d / "pieces" / "checkpoints/last.pt");
  test::require_same_tensors(a.model, b.model, "model");
  test::require_same_tensors(a.optimizer, b.optimizer, "optimizer");
  const auto la = test::epoch_lines(d / "straight" / "metrics.jsonl"), lb = test::epoch_lines(d / "pieces" / "metrics.jsonl");
  REQUIRE(la.size() == 3);
  REQUIRE(lb.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(la[i]["train_loss"] == lb[i]["train_loss"]);
  CHECK(la[0]["train_loss"] != la[1]["train_loss"]);
  (void)full;
}

TEST_CASE("a streamed schema-3 split gives the examples of the split in RAM, window by window",
          "[trainer][clips][stream]") {
  TempDir d;
  const fs::path data = clip_dataset(d / "data", {40, 12, 33, 70, 5, 28, 51, 19, 44, 60, 8, 36, 1, 90, 14});
  const trainer::Split ram = trainer::read_split(data / "train.h5", "train");
  const trainer::Split streamed = trainer::open_split_streamed(data / "train.h5", "train", 1 << 20);
  REQUIRE(streamed.streamed());
  CHECK(at::equal(streamed.read_clips(0, streamed.files()), ram.frames));
  CHECK(at::equal(streamed.read_clips(3, 4), ram.read_clips(3, 4)));
  const std::string name = GENERATE(std::string("tiles"), std::string("crops"));
  const double window_mib = GENERATE(0.0001, 1000.0);
  const int64_t prefetch = GENERATE(0, 2);
  CAPTURE(name, window_mib, prefetch);
  data::views::ViewOptions vo;
  vo.view = name;
  vo.tile_seconds = 0.08;
  vo.crop_seconds = 0.08;
  const auto view = trainer::split_view(ram, vo, false);
  trainer::LoaderOptions lo;
  lo.batch_size = 5;
  lo.prefetch = prefetch;
  lo.stream_window = window_mib;
  trainer::BatchLoader loader(streamed, *view, 8, lo, 9, at::kCPU);
  CHECK(loader.block_clips().back() == ram.files());
  for (int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    const at::Tensor order = loader.epoch_order(epoch);
    const auto examples = loader.epoch_examples(epoch);
    std::vector<data::views::Example> ordered;
    for (int64_t i = 0; i < order.size(0); ++i) ordered.push_back(examples[static_cast<std::size_t>(order[i].item<int64_t>())]);
    const trainer::ExampleBatch ref = trainer::gather_examples(ram, ordered, 8);
    std::vector<at::Tensor> xs, ls, cs;
    loader.start_epoch(epoch);
    while (auto b = loader.next()) {
      xs.push_back(b->x);
      ls.push_back(b->lengths);
      cs.push_back(b->clip);
    }
    CHECK(at::equal(at::cat(xs), ref.x));
    CHECK(at::equal(at::cat(ls), ref.lengths));
    CHECK(at::equal(at::cat(cs), ref.clip));
    const std::vector<int64_t> bounds = loader.window_bounds(epoch);
    std::set<int64_t> seen;
    for (std::size_t w = 0; w + 1 < bounds.size(); ++w) {
      std::set<int64_t> blocks;
      for (int64_t i = bounds[w]; i < bounds[w + 1]; ++i) {
        const int64_t c = ordered[static_cast<std::size_t>(i)].clip;
        const auto& first = loader.block_clips();
        blocks.insert(std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1);
      }
      CHECK(static_cast<int64_t>(blocks.size()) <= loader.window_blocks());
      for (const int64_t blk : blocks) CHECK(seen.insert(blk).second);
    }
  }
}

TEST_CASE("schema-1 and schema-2 datasets train a few epochs and learn, read as tiles of their segments",
          "[trainer][clips][legacy]") {
  const int schema = GENERATE(1, 2);
  CAPTURE(schema);
  TempDir d;
  const fs::path data = test::legacy_dataset(schema);
  const trainer::Dataset ds = trainer::load_dataset(data);
  CHECK(ds.train.meta.schema_version == schema);
  const auto view = trainer::split_view(ds.train, trainer::resolve_view_options({}, ds.train, "cnn"), false);
  std::vector<data::views::Example> examples = view->examples(ds.train.clip_frame_counts(), 0, 0);
  CHECK(static_cast<int64_t>(examples.size()) == ds.train.meta.valid_segments());
  for (const auto& e : examples) CHECK(e.real == 8);
  data::views::ViewOptions crops;
  crops.view = "crops";
  CHECK_THROWS_WITH(trainer::split_view(ds.train, crops, false), Catch::Contains("schema-" + std::to_string(schema)));

  std::ostringstream log;
  auto c = test::tiny_config(data, d / "run", 8);
  c.loader.batch_size = 8;
  c.model.hidden = 16;
  const trainer::TrainResult r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  CHECK(r.test->segment.accuracy > 0.6);
  CHECK(r.test->file.accuracy > 0.6);
  const nlohmann::json config = test::read_json(d / "run" / "config.json");
  CHECK(config["model_config"]["n_frames"] == 8);
}

}  // namespace melforge_test_trainer_clips
