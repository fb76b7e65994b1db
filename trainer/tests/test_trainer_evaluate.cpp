// evaluate() on a tiny dataset built through the builder library, against a naive loop that runs one forward pass
// per file: the same segment counts, loss and file decisions for both votes and any batch size; only valid long
// segments are computed; the model's mode and the autocast state are restored.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "catch_torch.h"

#include "data/dataset.h"
#include "eval/evaluate.h"
#include "melforge/common/errors.h"
#include "models/cnn.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_evaluate {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// Wraps a CNN and records the batch size of every forward pass.
class CountingModel : public Classifier {
 public:
  explicit CountingModel(const CnnConfig& c) : inner_(register_module("inner", std::make_shared<CnnNetImpl>(c))) {}
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override {
    batches.push_back(x.size(0));
    return inner_->forward(x, lengths);
  }
  std::string kind() const override { return "counting"; }
  nlohmann::json config_json() const override { return inner_->config_json(); }
  CnnNetImpl& inner() { return *inner_; }
  std::vector<int64_t> batches;

 private:
  std::shared_ptr<CnnNetImpl> inner_;
};

/// A dataset of the tone corpus (3 classes x 6 files), built once per test run.
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

std::unique_ptr<CountingModel> seeded_model(const Dataset& ds) {
  at::manual_seed(7);
  CnnConfig c = CnnConfig::from_info(ds.info, ds.num_classes());
  c.hidden = 32;
  auto m = std::make_unique<CountingModel>(c);
  const at::Tensor& mel = ds.train.mel;
  m->inner().set_input_normalization(mel.mean().item<double>(), mel.std().item<double>());
  return m;
}

/// The reference: one forward per file over all its L*S segments, the valid ones kept, votes as plain loops.
struct Naive {
  std::vector<std::vector<int64_t>> confusion, det_confusion;
  double loss_sum = 0;
  int64_t segments = 0;
  std::vector<std::vector<double>> file_probs;
  std::vector<double> file_score;
  std::vector<bool> file_detected;
  std::vector<int64_t> file_pred;
  std::vector<double> file_margin;  // gap between the best and second-best vote key
};

Naive naive_eval(CnnNetImpl& model, const Split& split, int64_t positive, double bce_weight, Vote vote,
                 double threshold) {
  model.eval();
  c10::NoGradGuard no_grad;
  const int64_t F = split.files(), L = split.info.num_long, S = split.info.num_short;
  const int64_t C = static_cast<int64_t>(split.class_names.size());
  Naive n;
  n.confusion.assign(C, std::vector<int64_t>(C, 0));
  n.det_confusion.assign(2, std::vector<int64_t>(2, 0));
  for (int64_t f = 0; f < F; ++f) {
    const int64_t y = split.label[f].item<int64_t>(), valid = split.num_valid_long[f].item<int64_t>();
    const ModelOutput out = model.forward(split.mel[f].reshape({L * S, split.info.n_mels, split.info.n_frames}));
    const at::Tensor logits = out.logits.slice(0, 0, valid * S), det = out.detection.slice(0, 0, valid * S);
    const at::Tensor labels = at::full({valid * S}, y, at::kLong);
    n.loss_sum += combined_loss({logits, det, {}}, labels, positive, bce_weight).item<double>() * double(valid * S);
    n.segments += valid * S;
    const at::Tensor p = at::softmax(logits, 1).to(at::kDouble), d = at::sigmoid(det).to(at::kDouble);
    std::vector<double> mean(C, 0.0), votes(C, 0.0);
    double det_mean = 0, det_votes = 0;
    for (int64_t l = 0; l < valid; ++l) {
      std::vector<double> lp(C, 0.0);
      double ld = 0;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = l * S + s;
        int64_t pred = 0;
        for (int64_t c = 0; c < C; ++c) {
          lp[c] += p[i][c].item<double>() / S;
          if (logits[i][c].item<float>() > logits[i][pred].item<float>()) pred = c;
        }
        n.confusion[y][pred]++;
        n.det_confusion[y == positive][d[i].item<double>() >= threshold]++;
        ld += d[i].item<double>() / S;
      }
      int64_t best = 0;
      for (int64_t c = 1; c < C; ++c)
        if (lp[c] > lp[best]) best = c;
      votes[best] += 1;
      for (int64_t c = 0; c < C; ++c) mean[c] += lp[c] / valid;
      det_mean += ld / valid;
      det_votes += ld >= threshold;
    }
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
      for (auto& v : votes) v /= valid;
      n.file_probs.push_back(votes);
      n.file_score.push_back(det_votes / valid);
      n.file_detected.push_back(det_votes / valid > 0.5);
    }
  }
  return n;
}

}  // namespace

TEST_CASE("evaluate equals a naive per-file loop", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  const Split& split = ds.train;
  REQUIRE(split.files() >= 8);
  const at::Tensor nvl = split.num_valid_long;
  REQUIRE(nvl.min().item<int64_t>() == 1);  // the corpus has files with padding long segments
  REQUIRE(nvl.max().item<int64_t>() == 2);

  const Vote vote = GENERATE(Vote::mean, Vote::majority);
  const int64_t batch = GENERATE(1, 12, 1024);
  const double threshold = GENERATE(0.3, 0.5);
  CAPTURE(to_string(vote), batch, threshold);
  const int64_t positive = 1;
  const double bce_weight = 0.7;

  auto model = seeded_model(ds);
  model->train();
  EvalOptions opts;
  opts.vote = to_string(vote);
  opts.batch_size = batch;
  opts.threshold = threshold;
  const EvalResult r = evaluate(*model, split, positive, bce_weight, opts, at::kCPU);
  CHECK(model->is_training());
  CHECK(model->inner().is_training());

  const int64_t S = ds.info.num_short;
  int64_t forwarded = 0;
  for (int64_t b : model->batches) {
    forwarded += b;
    CHECK((b <= std::max(batch, ds.info.num_long * S)));
  }
  CHECK(forwarded == split.valid_segments());
  if (batch == 1024) CHECK(model->batches.size() == 1);

  const Naive n = naive_eval(model->inner(), split, positive, bce_weight, vote, threshold);
  CHECK(r.segment.count == n.segments);
  CHECK(r.segment.confusion == n.confusion);
  CHECK(r.segment.det_confusion == n.det_confusion);
  CHECK(r.segment.loss == Approx(n.loss_sum / double(n.segments)).epsilon(1e-5));

  REQUIRE(r.files.predicted.size(0) == split.files());
  std::vector<std::vector<int64_t>> file_conf(3, std::vector<int64_t>(3, 0)), det_conf(2, std::vector<int64_t>(2, 0));
  for (int64_t f = 0; f < split.files(); ++f) {
    CAPTURE(f);
    const int64_t y = split.label[f].item<int64_t>();
    file_conf[y][n.file_pred[f]]++;
    det_conf[y == positive][n.file_detected[f]]++;
    if (n.file_margin[f] > 1e-5) CHECK(r.files.predicted[f].item<int64_t>() == n.file_pred[f]);
    CHECK(r.files.detection_score[f].item<double>() == Approx(n.file_score[f]).margin(1e-5));
    for (int64_t c = 0; c < 3; ++c)
      CHECK(r.files.class_probs[f][c].item<double>() == Approx(n.file_probs[f][c]).margin(1e-5));
  }
  bool clear = true;
  for (int64_t f = 0; f < split.files(); ++f) clear = clear && n.file_margin[f] > 1e-5;
  if (clear) CHECK(r.file.confusion == file_conf);
  CHECK(r.file.count == split.files());
  CHECK(std::isnan(r.file.loss));
  CHECK(r.files_per_s > 0);
  const auto j = r.to_json(ds.class_names);
  CHECK(j["segment"]["count"] == n.segments);
  CHECK(j["file"]["count"] == split.files());
}

TEST_CASE("evaluate under bfloat16 autocast stays close and restores the autocast state", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  auto model = seeded_model(ds);
  EvalOptions opts;
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

TEST_CASE("evaluate refuses an empty split and bad options", "[trainer][evaluate]") {
  const Dataset& ds = tiny_dataset();
  auto model = seeded_model(ds);
  Split empty = ds.val;
  empty.mel = ds.val.mel.slice(0, 0, 0);
  empty.label = ds.val.label.slice(0, 0, 0);
  empty.num_valid_long = ds.val.num_valid_long.slice(0, 0, 0);
  empty.paths.clear();
  EvalOptions opts;
  CHECK_THROWS_AS(evaluate(*model, empty, 0, 1.0, opts, at::kCPU), FormatError);
  opts.vote = "median";
  CHECK_THROWS_AS(evaluate(*model, ds.val, 0, 1.0, opts, at::kCPU), InvalidArgument);
  opts = {};
  opts.threshold = 1.0;
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  opts = {};
  opts.batch_size = 0;
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  opts = {};
  opts.split = "dev";
  CHECK_THROWS_AS(opts.validate(), InvalidArgument);
  CHECK_THROWS_AS(evaluate(*model, ds.val, 3, 1.0, EvalOptions{}, at::kCPU), InvalidArgument);
}

}  // namespace melforge_test_trainer_evaluate
