// Classification metrics on hand-computed cases, the device-side accumulator, and the clip vote of vote_clips
// against kernels/vote's CPU vote (which tests/test_vote.cpp checks against a naive loop).
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <cmath>
#include <span>
#include <vector>

#include "eval/metrics.h"
#include "melforge/common/errors.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_metrics {

using namespace melforge;
using namespace melforge::trainer;

namespace {

/// Logits [N, C] whose argmax is `pred[i]`, with the labels, from a confusion matrix (true, predicted) of counts.
void batch_from_confusion(const std::vector<std::vector<int64_t>>& conf, at::Tensor& logits, at::Tensor& labels) {
  const int64_t C = static_cast<int64_t>(conf.size());
  std::vector<int64_t> y, p;
  for (int64_t t = 0; t < C; ++t)
    for (int64_t q = 0; q < C; ++q)
      for (int64_t k = 0; k < conf[t][q]; ++k) {
        y.push_back(t);
        p.push_back(q);
      }
  const int64_t N = static_cast<int64_t>(y.size());
  logits = at::randn({N, C}, at::kFloat) * 0.1;
  for (int64_t i = 0; i < N; ++i) logits[i][p[i]] = 5.0;
  labels = at::tensor(y, at::kLong);
}

}  // namespace

TEST_CASE("three classes: precision, recall, F1 and macro-F1 by hand", "[trainer][metrics]") {
  const std::vector<std::vector<int64_t>> conf = {{5, 2, 1}, {1, 6, 3}, {0, 2, 4}};
  at::Tensor logits, labels;
  at::manual_seed(1);
  batch_from_confusion(conf, logits, labels);
  MetricAccumulator acc(3, 0, 0.5, at::kCPU);
  const int64_t half = labels.size(0) / 2;
  acc.add(logits.slice(0, 0, half), at::zeros({half}), labels.slice(0, 0, half));
  acc.add(logits.slice(0, half), at::zeros({labels.size(0) - half}), labels.slice(0, half));
  const Metrics m = acc.finish();

  CHECK(m.confusion == conf);
  CHECK(m.count == 24);
  CHECK(m.accuracy == Approx(15.0 / 24));
  // class 0: tp 5, predicted 6, support 8; class 1: 6, 10, 10; class 2: 4, 8, 6.
  CHECK(m.per_class[0].precision == Approx(5.0 / 6));
  CHECK(m.per_class[0].recall == Approx(5.0 / 8));
  CHECK(m.per_class[0].f1 == Approx(5.0 / 7));
  CHECK(m.per_class[1].precision == Approx(0.6));
  CHECK(m.per_class[1].recall == Approx(0.6));
  CHECK(m.per_class[1].f1 == Approx(0.6));
  CHECK(m.per_class[2].precision == Approx(0.5));
  CHECK(m.per_class[2].recall == Approx(2.0 / 3));
  CHECK(m.per_class[2].f1 == Approx(4.0 / 7));
  CHECK(m.per_class[0].support == 8);
  CHECK(m.per_class[1].support == 10);
  CHECK(m.per_class[2].support == 6);
  CHECK(m.macro_f1 == Approx((5.0 / 7 + 0.6 + 4.0 / 7) / 3));
  CHECK(std::isnan(m.loss));

  const Metrics direct = metrics_from_counts(at::tensor({5, 2, 1, 1, 6, 3, 0, 2, 4}, at::kLong).view({3, 3}),
                                             at::zeros({2, 2}, at::kLong), 12.0);
  CHECK(direct.macro_f1 == Approx(m.macro_f1));
  CHECK(direct.loss == Approx(0.5));
}

TEST_CASE("classes without support or without predictions score 0", "[trainer][metrics]") {
  // class 0 predicted but never true; class 2 true but never predicted; class 3 neither.
  const at::Tensor conf = at::tensor({0, 0, 0, 0,  //
                                      2, 3, 0, 0,  //
                                      1, 1, 0, 0,  //
                                      0, 0, 0, 0},
                                     at::kLong)
                              .view({4, 4});
  const Metrics m = metrics_from_counts(conf, at::zeros({2, 2}, at::kLong), 0.0);
  for (int c : {0, 2, 3}) {
    CAPTURE(c);
    CHECK(m.per_class[c].precision == 0.0);
    CHECK(m.per_class[c].recall == 0.0);
    CHECK(m.per_class[c].f1 == 0.0);
  }
  CHECK(m.per_class[0].support == 0);
  CHECK(m.per_class[3].support == 0);
  CHECK(m.per_class[2].support == 2);
  // class 1: tp 3, predicted 4, support 5 -> F1 = 2 * 0.75 * 0.6 / 1.35 = 2/3; macro over classes 1 and 2 only.
  CHECK(m.per_class[1].f1 == Approx(2.0 / 3));
  CHECK(m.macro_f1 == Approx((2.0 / 3 + 0.0) / 2));
  CHECK(m.accuracy == Approx(3.0 / 7));
  CHECK(m.det_accuracy == 0.0);
  CHECK(m.det_f1 == 0.0);

  const Metrics empty = metrics_from_counts(at::zeros({3, 3}, at::kLong), at::zeros({2, 2}, at::kLong), 0.0);
  CHECK(empty.count == 0);
  CHECK(empty.accuracy == 0.0);
  CHECK(empty.macro_f1 == 0.0);
  CHECK(std::isnan(empty.loss));
}

TEST_CASE("binary head: counts at the threshold boundary", "[trainer][metrics]") {
  const double threshold = GENERATE(0.5, 0.25, 0.8);
  CAPTURE(threshold);
  const int64_t positive = 1;
  // Probabilities exactly at the threshold (float), just below and just above; the logit is computed so that
  // sigmoid(logit) in float lands on the intended side of the threshold, checked here independently.
  const float at_logit = static_cast<float>(std::log(threshold / (1 - threshold)));
  std::vector<float> logits_v = {at_logit, std::nextafter(at_logit, -100.f) - 1e-4f, at_logit + 1e-3f,
                                 at_logit - 1e-3f, 10.f, -10.f};
  const std::vector<int64_t> labels_v = {1, 1, 0, 0, 2, 1};
  const at::Tensor det_logits = at::tensor(logits_v, at::kFloat);
  const at::Tensor probs = at::sigmoid(det_logits);
  int64_t tn = 0, fp = 0, fn = 0, tp = 0;
  for (std::size_t i = 0; i < logits_v.size(); ++i) {
    const bool pred = probs[static_cast<int64_t>(i)].item<float>() >= threshold;
    const bool truth = labels_v[i] == positive;
    (truth ? (pred ? tp : fn) : (pred ? fp : tn))++;
  }
  // The boundary cases must fall where intended for the test to mean something.
  REQUIRE(probs[1].item<float>() < threshold);
  REQUIRE(probs[2].item<float>() >= threshold);
  REQUIRE(probs[3].item<float>() < threshold);
  MetricAccumulator acc(3, positive, threshold, at::kCPU);
  acc.add(at::zeros({6, 3}), det_logits, at::tensor(labels_v, at::kLong));
  const Metrics m = acc.finish();
  CHECK(m.det_confusion == std::vector<std::vector<int64_t>>{{tn, fp}, {fn, tp}});
  CHECK(m.det_accuracy == Approx(double(tn + tp) / 6));
  CHECK(m.det_precision == Approx(tp + fp ? double(tp) / double(tp + fp) : 0.0));
  CHECK(m.det_recall == Approx(tp + fn ? double(tp) / double(tp + fn) : 0.0));
}

TEST_CASE("sigmoid of 0 is exactly 0.5 and counts as positive at threshold 0.5", "[trainer][metrics]") {
  MetricAccumulator acc(2, 0, 0.5, at::kCPU);
  acc.add(at::zeros({3, 2}), at::tensor({0.0f, -1e-6f, 1e-6f}), at::tensor({0, 0, 1}, at::kLong));
  const Metrics m = acc.finish();
  CHECK(m.det_confusion == std::vector<std::vector<int64_t>>{{0, 1}, {1, 1}});
  CHECK(m.det_precision == Approx(0.5));
  CHECK(m.det_recall == Approx(0.5));
  CHECK(m.det_f1 == Approx(0.5));
}

TEST_CASE("the accumulator sums losses over batches and resets", "[trainer][metrics]") {
  MetricAccumulator acc(2, 1, 0.5, at::kCPU);
  acc.add(at::zeros({4, 2}), at::zeros({4}), at::zeros({4}, at::kLong), at::scalar_tensor(2.0));
  acc.add(at::zeros({2, 2}), at::zeros({2}), at::ones({2}, at::kLong), at::scalar_tensor(1.0, at::kFloat));
  Metrics m = acc.finish();
  CHECK(m.count == 6);
  CHECK(m.loss == Approx(0.5));
  CHECK(m.accuracy == Approx(4.0 / 6));
  acc.reset();
  acc.add(at::zeros({1, 2}), at::zeros({1}), at::zeros({1}, at::kLong));
  m = acc.finish();
  CHECK(m.count == 1);
  CHECK(std::isnan(m.loss));
  CHECK_THROWS_AS(acc.add(at::zeros({2, 3}), at::zeros({2}), at::zeros({2}, at::kLong)), InvalidArgument);
  CHECK_THROWS_AS(MetricAccumulator(2, 2, 0.5, at::kCPU), InvalidArgument);
}

TEST_CASE("metrics as JSON and the confusion CSV", "[trainer][metrics]") {
  const Metrics m = metrics_from_counts(at::tensor({3, 1, 0, 2}, at::kLong).view({2, 2}),
                                        at::tensor({1, 0, 2, 3}, at::kLong).view({2, 2}), 3.0);
  const auto j = m.to_json({"dog", "cat,tabby"});
  CHECK(j["count"] == 6);
  CHECK(j["loss"].get<double>() == Approx(0.5));
  CHECK(j["per_class"]["dog"]["support"] == 4);
  CHECK(j["per_class"]["cat,tabby"]["recall"].get<double>() == Approx(1.0));
  CHECK(j["confusion"][0][1] == 1);
  CHECK(j["detection"]["recall"].get<double>() == Approx(0.6));
  CHECK(m.confusion_csv({"dog", "cat,tabby"}) == "true\\pred,dog,\"cat,tabby\"\ndog,3,1\n\"cat,tabby\",0,2\n");
  CHECK(metrics_from_counts(at::zeros({2, 2}, at::kLong), at::zeros({2, 2}, at::kLong), NAN)
            .to_json({"a", "b"})["loss"]
            .is_null());
}

TEST_CASE("vote names", "[trainer][metrics]") {
  CHECK(parse_vote("mean") == Vote::mean);
  CHECK(parse_vote("majority") == Vote::majority);
  CHECK(to_string(Vote::majority) == "majority");
  CHECK_THROWS_AS(parse_vote("median"), InvalidArgument);
}

TEST_CASE("majority ties are broken by the mean probability, each clip votes over its own examples",
          "[trainer][metrics]") {
  // Clip 0 has two examples: one votes class 0 (0.55), one class 1 (0.9); clip 1's single example (class 0 at 1.0)
  // would make class 0 win clip 0 if it were counted there.
  const at::Tensor probs = at::tensor({0.55f, 0.45f, 0.1f, 0.9f, 1.0f, 0.0f}).view({3, 2});
  const at::Tensor det = at::tensor({0.6f, 0.4f, 1.0f});
  const at::Tensor clip = at::tensor({0, 0, 1}, at::kLong);
  const FileScores maj = vote_clips(probs, det, clip, 2, Vote::majority, 0.5);
  CHECK(maj.predicted[0].item<int64_t>() == 1);
  CHECK(maj.class_probs[0][0].item<float>() == 0.5f);
  CHECK(maj.class_probs[0][1].item<float>() == 0.5f);
  CHECK(maj.detection_score[0].item<float>() == 0.5f);
  CHECK_FALSE(maj.detected[0].item<bool>());  // exactly half is not "more than half"
  CHECK(maj.predicted[1].item<int64_t>() == 0);
  const FileScores mean = vote_clips(probs, det, clip, 2, Vote::mean, 0.5);
  CHECK(mean.predicted[0].item<int64_t>() == 1);
  CHECK(mean.class_probs[0][0].item<float>() == Approx(0.325));
  CHECK(mean.detection_score[0].item<float>() == Approx(0.5));
  CHECK(mean.detected[0].item<bool>());
  CHECK_THROWS_AS(vote_clips(probs, det.view({1, 3}), clip, 2, Vote::mean, 0.5), InvalidArgument);
}

TEST_CASE("the accumulator on CUDA equals the CPU", "[trainer][metrics][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  at::manual_seed(3);
  const at::Tensor logits = at::randn({500, 4}), det = at::randn({500}), y = at::randint(0, 4, {500}, at::kLong);
  MetricAccumulator cpu(4, 2, 0.4, at::kCPU), gpu(4, 2, 0.4, at::Device(at::kCUDA, 0));
  cpu.add(logits, det, y, at::scalar_tensor(3.0));
  gpu.add(logits.cuda(), det.cuda(), y.cuda(), at::scalar_tensor(3.0).cuda());
  const Metrics a = cpu.finish(), b = gpu.finish();
  CHECK(a.confusion == b.confusion);
  CHECK(a.det_confusion == b.det_confusion);
  CHECK(a.loss == b.loss);
}

TEST_CASE("the ATen clip vote equals the CPU clip vote of kernels/vote", "[trainer][metrics]") {
  const int64_t F = GENERATE(1, 9);
  const int64_t per_clip = GENERATE(1, 4);
  const int64_t C = GENERATE(2, 5);
  const Vote v = GENERATE(Vote::mean, Vote::majority);
  const bool detection = GENERATE(true, false);
  CAPTURE(F, per_clip, C, to_string(v), detection);
  at::manual_seed(static_cast<uint64_t>(11 + F * 100 + per_clip * 10 + C));
  const at::Tensor counts = at::randint(1, per_clip + 1, {F}, at::kLong);
  const at::Tensor clip =
      at::arange(F, at::kLong).repeat_interleave(counts).index_select(0, at::randperm(counts.sum().item<int64_t>()));
  const int64_t E = clip.size(0);
  const at::Tensor probs = at::softmax(at::randn({E, C}) * 2, 1).contiguous();
  const at::Tensor det = detection ? at::rand({E}).contiguous() : at::Tensor();
  const FileScores a = vote_clips(probs, det, clip, F, v, 0.4);
  const vote::FileVotes b = vote::vote_clips(
      {probs.data_ptr<float>(), static_cast<std::size_t>(probs.numel())},
      detection ? std::span<const float>(det.data_ptr<float>(), static_cast<std::size_t>(E)) : std::span<const float>(),
      {clip.data_ptr<int64_t>(), static_cast<std::size_t>(E)}, F, C, v, 0.4);
  for (int64_t f = 0; f < F; ++f) {
    CAPTURE(f);
    CHECK(a.predicted[f].item<int64_t>() == b.predicted[f]);
    CHECK(a.detected[f].item<bool>() == (b.detected[f] != 0));
    CHECK(a.detection_score[f].item<float>() == Approx(b.detection_score[f]).margin(1e-6));
    for (int64_t c = 0; c < C; ++c)
      CHECK(a.class_probs[f][c].item<float>() == Approx(b.class_probs[f * C + c]).margin(1e-6));
  }
}

TEST_CASE("the clip vote on CUDA equals the CPU", "[trainer][metrics][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  at::manual_seed(5);
  const at::Tensor clip = at::tensor({0, 2, 1, 0, 2, 2, 1, 3}, at::kLong);
  const at::Tensor probs = at::softmax(at::randn({8, 3}), 1), det = at::rand({8});
  for (Vote v : {Vote::mean, Vote::majority}) {
    const FileScores c = vote_clips(probs, det, clip, 4, v, 0.5);
    const FileScores g = vote_clips(probs.cuda(), det.cuda(), clip.cuda(), 4, v, 0.5);
    CHECK(at::equal(c.predicted, g.predicted.cpu()));
    CHECK(at::allclose(c.class_probs, g.class_probs.cpu()));
    CHECK(at::equal(c.detected, g.detected.cpu()));
  }
}

}  // namespace melforge_test_trainer_metrics
