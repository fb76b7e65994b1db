// evaluate() on a tiny dataset built through the builder library, against a naive loop that cuts each clip into
// tiles itself and runs one forward pass per tile: the same tile counts, loss and clip decisions for both votes and
// any batch size; every frame of every clip is scored (the last tile padded and masked by its length); padding values
// change no score; a clip much shorter than one tile is scored from its real frames; the model's mode and the
// autocast state are restored.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "catch_torch.h"

#include "data/dataset.h"
#include "eval/evaluate.h"
#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "clip_fixture.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_evaluate {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// Wraps a CNN and records the batch size and the lengths of every forward pass.
class CountingModel : public Classifier {
 public:
  explicit CountingModel(const CnnConfig& c) : inner_(register_module("inner", std::make_shared<CnnNetImpl>(c))) {}
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override {
    batches.push_back(x.size(0));
    if (lengths.defined()) padded_rows += lengths.lt(x.size(-1)).sum().item<int64_t>();
    return inner_->forward(x, lengths);
  }
  std::string kind() const override { return "counting"; }
  nlohmann::json architecture_json() const override { return inner_->config_json(); }
  CnnNetImpl& inner() { return *inner_; }
  std::vector<int64_t> batches;
  int64_t padded_rows = 0;

 private:
  std::shared_ptr<CnnNetImpl> inner_;
};

/// A dataset of the tone corpus (3 classes x 6 files, clips of 0.6 to 2.6 s), built once per test run.
const Dataset& tiny_dataset() {
  static TempDir dir;
  static const Dataset ds = [] {
    test::write_tone_corpus(dir / "in", 3, 5);
    auto c = test::tiny_build_config(dir / "in", dir / "out");
    c.build.split = "0.7,0.15,0.15";
    builder::run_build(c);
    return load_dataset(dir / "out");
  }();
  return ds;
}

/// The view the tests train and evaluate through: tiles of the dataset's short_seconds (the resolved default).
EvalOptions tile_options(const Split& split) {
  EvalOptions opts;
  opts.view = resolve_view_options(data::views::ViewOptions{}, split, "cnn");
  return opts;
}

std::unique_ptr<CountingModel> seeded_model(const Dataset& ds) {
  at::manual_seed(7);
  CnnConfig c = CnnConfig::from_info(ds.info, ds.num_classes());
  c.hidden = 32;
  auto m = std::make_unique<CountingModel>(c);
  const at::Tensor& frames = ds.train.frames;
  m->inner().set_input_normalization(frames.mean().item<double>(), frames.std().item<double>());
  return m;
}

/// The reference: each clip cut into tiles of `tile` frames side by side here (the last one padded with the split's
/// pad value), one forward per tile with its real length, votes as plain loops.
struct Naive {
  std::vector<std::vector<int64_t>> confusion, det_confusion;
  double loss_sum = 0;
  int64_t tiles = 0, padded_tiles = 0;
  std::vector<std::vector<double>> file_probs;
  std::vector<double> file_score;
  std::vector<bool> file_detected;
  std::vector<int64_t> file_pred;
  std::vector<double> file_margin;  // gap between the best and second-best vote key
};

Naive naive_eval(CnnNetImpl& model, const Split& split, int64_t tile, int64_t positive, double bce_weight, Vote vote,
                 double threshold) {
  model.eval();
  c10::NoGradGuard no_grad;
  const int64_t F = split.files(), M = split.info.n_mels, C = static_cast<int64_t>(split.class_names.size());
  Naive n;
  n.confusion.assign(C, std::vector<int64_t>(C, 0));
  n.det_confusion.assign(2, std::vector<int64_t>(2, 0));
  for (int64_t f = 0; f < F; ++f) {
    const int64_t y = split.label[f].item<int64_t>();
    const at::Tensor frames = split.read_clips(f, 1);
    const int64_t T = frames.size(0);
    REQUIRE(T == split.clip_frames(f));
    std::vector<double> mean(C, 0.0), votes(C, 0.0);
    double det_mean = 0, det_votes = 0, count = 0;
    std::vector<std::vector<double>> tile_p;
    std::vector<double> tile_d;
    for (int64_t start = 0; start < T; start += tile) {
      const int64_t real = std::min(tile, T - start);
      at::Tensor x = at::full({1, M, tile}, split.pad_value());
      x[0].narrow(1, 0, real).copy_(frames.narrow(0, start, real).t());
      const ModelOutput out = model.forward(x, at::full({1}, real, at::kLong));
      n.loss_sum += combined_loss(out, at::full({1}, y, at::kLong), positive, bce_weight).item<double>();
      ++n.tiles;
      n.padded_tiles += real < tile;
      const at::Tensor p = at::softmax(out.logits, 1).to(at::kDouble)[0];
      const double d = at::sigmoid(out.detection).to(at::kDouble)[0].item<double>();
      int64_t pred = 0, best = 0;
      for (int64_t c = 0; c < C; ++c) {
        if (out.logits[0][c].item<float>() > out.logits[0][pred].item<float>()) pred = c;
        if (p[c].item<double>() > p[best].item<double>()) best = c;
        mean[c] += p[c].item<double>();
      }
      n.confusion[y][pred]++;
      n.det_confusion[y == positive][d >= threshold]++;
      votes[best] += 1;
      det_mean += d;
      det_votes += d >= threshold;
      count += 1;
    }
    for (auto& m : mean) m /= count;
    det_mean /= count;
    std::vector<double> key(C);
    for (int64_t c = 0; c < C; ++c) key[c] = vote == Vote::mean ? mean[c] : votes[c] * 2 + mean[c];
    int64_t pred = 0;
    for (int64_t c = 1; c < C; ++c)
      if (key[c] > key[pred]) pred = c;
    double second = -1e300;
    for (int64_t c = 0; c < C; ++c)
      if (c != pred) second = std::max(second, key[c]);
    n.file_pred.push_back(pred);
    n.file_margin.push_back(key[pred] - second);
    if (vote == Vote::mean) {
      n.file_probs.push_back(mean);
      n.file_score.push_back(det_mean);
      n.file_detected.push_back(det_mean >= threshold);
    } else {
      for (auto& v : votes) v /= count;
      n.file_probs.push_back(votes);
      n.file_score.push_back(det_votes / count);
      n.file_detected.push_back(det_votes / count > 0.5);
    }
  }
  return n;
}

}  // namespace

TEST_CASE("evaluate equals a naive per-tile loop and scores every frame of every clip", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  const Split& split = ds.train;
  REQUIRE(split.files() >= 8);
  const EvalOptions base = tile_options(split);
  const int64_t tile = example_frames(base.view, split);
  REQUIRE(tile == ds.info.n_frames);
  int64_t ragged = 0;
  for (const int64_t t : split.clip_frame_counts()) ragged += t % tile != 0;
  REQUIRE(ragged > 0);  // clips whose last tile is padded

  const Vote vote = GENERATE(Vote::mean, Vote::majority);
  const int64_t batch = GENERATE(1, 12, 1024);
  const double threshold = GENERATE(0.3, 0.5);
  CAPTURE(to_string(vote), batch, threshold);
  const int64_t positive = 1;
  const double bce_weight = 0.7;

  auto model = seeded_model(ds);
  model->train();
  EvalOptions opts = base;
  opts.vote = to_string(vote);
  opts.batch_size = batch;
  opts.threshold = threshold;
  const EvalResult r = evaluate(*model, split, positive, bce_weight, opts, at::kCPU);
  CHECK(model->is_training());
  CHECK(model->inner().is_training());

  const Naive n = naive_eval(model->inner(), split, tile, positive, bce_weight, vote, threshold);
  int64_t forwarded = 0;
  for (int64_t b : model->batches) {
    forwarded += b;
    CHECK(b <= batch);
  }
  CHECK(forwarded == n.tiles);
  CHECK(model->padded_rows == n.padded_tiles);
  CHECK(n.padded_tiles == ragged);
  if (batch == 1024) CHECK(model->batches.size() == 1);
  CHECK(r.segment.count == n.tiles);
  CHECK(r.segment.confusion == n.confusion);
  CHECK(r.segment.det_confusion == n.det_confusion);
  CHECK(r.segment.loss == Approx(n.loss_sum / double(n.tiles)).epsilon(1e-5));

  REQUIRE(r.files.predicted.size(0) == split.files());
  std::vector<std::vector<int64_t>> file_conf(3, std::vector<int64_t>(3, 0));
  bool clear = true;
  for (int64_t f = 0; f < split.files(); ++f) {
    CAPTURE(f);
    file_conf[split.label[f].item<int64_t>()][n.file_pred[f]]++;
    clear = clear && n.file_margin[f] > 1e-5;
    if (n.file_margin[f] > 1e-5) CHECK(r.files.predicted[f].item<int64_t>() == n.file_pred[f]);
    CHECK(r.files.detection_score[f].item<double>() == Approx(n.file_score[f]).margin(1e-5));
    for (int64_t c = 0; c < 3; ++c)
      CHECK(r.files.class_probs[f][c].item<double>() == Approx(n.file_probs[f][c]).margin(1e-5));
  }
  if (clear) CHECK(r.file.confusion == file_conf);
  CHECK(r.file.count == split.files());
  CHECK(std::isnan(r.file.loss));
  CHECK(r.files_per_s > 0);

  const Coverage& cov = r.coverage;
  CHECK(cov.view == "tiles");
  CHECK(cov.example_frames == tile);
  CHECK(cov.clips == split.files());
  CHECK(cov.clips_scored == split.files());
  CHECK(cov.examples == n.tiles);
  CHECK(cov.frames == split.total_frames());
  CHECK(cov.frames_covered == cov.frames);
  CHECK(cov.fraction() == 1.0);
  CHECK(cov.padded_frames == n.tiles * tile - split.total_frames());
  double seconds = 0;
  for (const int64_t s : split.meta.num_samples) seconds += double(s) / double(split.info.sample_rate);
  CHECK(cov.seconds == Approx(seconds));
  CHECK(cov.seconds_scored == Approx(seconds));
  const auto j = r.to_json(ds.class_names);
  CHECK(j["tiles"]["count"] == n.tiles);
  CHECK(j["file"]["count"] == split.files());
  CHECK(j["coverage"]["fraction"] == 1.0);
  CHECK_FALSE(j.contains("segment"));
}

TEST_CASE("padding never reaches a vote: a clip that is mostly padding is scored from its real frames",
          "[trainer][evaluate]") {
  // A clip much shorter than one tile (a few frames of a 32-frame tile) and the padded last tiles of the others:
  // changing the value the padding holds changes no score, and the short clip's score is the model's output on its
  // real frames alone (no padding at all).
  const Dataset& ds = tiny_dataset();
  Split split = ds.test;
  const EvalOptions opts = tile_options(split);
  const int64_t tile = example_frames(opts.view, split);
  const int64_t keep = 3;
  REQUIRE(split.clip_frames(0) > keep);
  at::Tensor first = split.frames.narrow(0, 0, keep);
  split.frames = at::cat({first, split.frames.narrow(0, split.meta.frame_offset[1], split.total_frames() -
                                                                                       split.meta.frame_offset[1])});
  const int64_t cut = split.meta.frame_offset[1] - keep;
  for (std::size_t f = 1; f < split.meta.frame_offset.size(); ++f) split.meta.frame_offset[f] -= cut;
  split.meta.num_samples[0] = keep * split.info.hop_length;
  REQUIRE(split.clip_frames(0) == keep);
  REQUIRE(keep * 4 < tile);

  auto model = seeded_model(ds);
  const EvalResult a = evaluate(*model, split, 1, 1.0, opts, at::kCPU);
  Split louder = split;
  louder.info.amin = split.info.amin * 1e6;  // another silence value: the padding holds something else
  REQUIRE(louder.pad_value() != split.pad_value());
  const EvalResult b = evaluate(*model, louder, 1, 1.0, opts, at::kCPU);
  CHECK(at::equal(a.files.class_probs, b.files.class_probs));
  CHECK(at::equal(a.files.detection_score, b.files.detection_score));
  CHECK(a.segment.confusion == b.segment.confusion);
  CHECK(a.segment.loss == b.segment.loss);
  CHECK(a.coverage.frames_covered == a.coverage.frames);

  model->eval();
  c10::NoGradGuard no_grad;
  const at::Tensor alone = at::softmax(model->inner().forward(first.t().unsqueeze(0)).logits, 1)[0];
  CHECK(at::allclose(a.files.class_probs[0], alone, 1e-5, 1e-6));
}

TEST_CASE("schema-1 and schema-2 datasets evaluate every valid short segment as a tile, each clip voted",
          "[trainer][evaluate][legacy]") {
  const int schema = GENERATE(1, 2);
  CAPTURE(schema);
  const Dataset ds = load_dataset(test::legacy_dataset(schema));
  const Split& split = ds.test;
  REQUIRE(split.meta.schema_version == schema);
  at::manual_seed(3);
  CnnConfig c = CnnConfig::from_info(ds.info, ds.num_classes());
  c.hidden = 16;
  CountingModel model(c);
  const EvalOptions opts = tile_options(split);
  const EvalResult r = evaluate(model, split, 0, 1.0, opts, at::kCPU);
  CHECK(r.coverage.examples == split.meta.valid_segments());
  CHECK(r.coverage.example_frames == ds.info.n_frames);
  CHECK(r.coverage.clips_scored == split.files());
  CHECK(r.coverage.frames_covered == r.coverage.frames);
  CHECK(r.coverage.padded_frames == 0);
  CHECK(model.padded_rows == 0);
  const Naive n = naive_eval(model.inner(), split, ds.info.n_frames, 0, 1.0, Vote::mean, 0.5);
  CHECK(r.segment.confusion == n.confusion);
  for (int64_t f = 0; f < split.files(); ++f)
    for (int64_t k = 0; k < ds.num_classes(); ++k)
      CHECK(r.files.class_probs[f][k].item<double>() == Approx(n.file_probs[f][k]).margin(1e-5));
}

TEST_CASE("evaluate under bfloat16 autocast stays close and restores the autocast state", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  auto model = seeded_model(ds);
  const EvalOptions opts = tile_options(ds.train);
  const EvalResult full = evaluate(*model, ds.train, 0, 1.0, opts, at::kCPU);
  REQUIRE_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  const EvalResult half = evaluate(*model, ds.train, 0, 1.0, opts, at::kCPU, at::kBFloat16);
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  CHECK(model->is_training());
  CHECK(half.segment.count == full.segment.count);
  CHECK(half.segment.loss == Approx(full.segment.loss).epsilon(0.05));
  CHECK(at::allclose(half.files.class_probs, full.files.class_probs, 0.0, 0.05));
  CHECK_THROWS_AS(evaluate(*model, ds.train, 0, 1.0, opts, at::kCPU, at::kInt), InvalidArgument);
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST_CASE("evaluate refuses an empty split, bad options and tiles the model was not built for", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  auto model = seeded_model(ds);
  Split empty = ds.val;
  empty.frames = ds.val.frames.slice(0, 0, 0);
  empty.label = ds.val.label.slice(0, 0, 0);
  empty.meta.frame_offset = {0};
  empty.meta.num_samples.clear();
  empty.meta.clip_flags.clear();
  empty.paths.clear();
  EvalOptions opts = tile_options(ds.val);
  CHECK_THROWS_AS(evaluate(*model, empty, 0, 1.0, opts, at::kCPU), FormatError);
  opts.vote = "median";
  CHECK_THROWS_AS(evaluate(*model, ds.val, 0, 1.0, opts, at::kCPU), InvalidArgument);
  opts = tile_options(ds.val);
  opts.view.tile_seconds *= 2;
  CHECK_THROWS_WITH(evaluate(*model, ds.val, 0, 1.0, opts, at::kCPU), Catch::Contains("was built for inputs of"));
  opts = {};
  opts.threshold = 1.0;
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  opts = {};
  opts.batch_size = 0;
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  opts = {};
  opts.split = "dev";
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  CHECK_THROWS_AS(evaluate(*model, ds.val, 3, 1.0, tile_options(ds.val), at::kCPU), InvalidArgument);
}

}  // namespace melforge_test_trainer_evaluate
