#include "eval/metrics.h"

#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "melforge/common/errors.h"
#include "util.h"

namespace melforge::trainer {

namespace {

std::vector<std::vector<int64_t>> to_rows(const at::Tensor& counts) {
  const at::Tensor c = counts.to(at::kCPU, at::kLong).contiguous();
  const int64_t rows = c.size(0), cols = c.size(1);
  const int64_t* p = c.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(rows), std::vector<int64_t>(cols));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t q = 0; q < cols; ++q) out[t][q] = p[t * cols + q];
  return out;
}

}  // namespace

Metrics metrics_from_counts(const at::Tensor& confusion, const at::Tensor& det_confusion, double loss_sum) {
  if (confusion.dim() != 2 || confusion.size(0) != confusion.size(1))
    throw InvalidArgument("metrics_from_counts: confusion must be [C, C]");
  if (det_confusion.dim() != 2 || det_confusion.size(0) != 2 || det_confusion.size(1) != 2)
    throw InvalidArgument("metrics_from_counts: det_confusion must be [2, 2]");
  return metrics::metrics_from_confusion(to_rows(confusion), to_rows(det_confusion), loss_sum);
}

MetricAccumulator::MetricAccumulator(int64_t num_classes, int64_t positive_class, double threshold, at::Device device)
    : num_classes_(num_classes), positive_class_(positive_class), threshold_(threshold) {
  if (num_classes < 1) throw InvalidArgument("MetricAccumulator: num_classes must be >= 1");
  if (positive_class < -1 || positive_class >= num_classes)
    throw InvalidArgument("MetricAccumulator: positive_class " + std::to_string(positive_class) + " outside [0, " +
                          std::to_string(num_classes) + ")");
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  confusion_ = at::zeros({num_classes * num_classes}, opts);
  det_confusion_ = at::zeros({4}, opts);
  loss_sum_ = at::zeros({}, opts.dtype(at::kDouble));
}

void MetricAccumulator::add(const at::Tensor& logits, const at::Tensor& detection, const at::Tensor& labels,
                            const at::Tensor& loss_sum) {
  if (logits.dim() != 2 || logits.size(1) != num_classes_ || detection.dim() != 1 || labels.dim() != 1 ||
      detection.size(0) != logits.size(0) || labels.size(0) != logits.size(0))
    throw InvalidArgument("MetricAccumulator::add: expected logits [B, " + std::to_string(num_classes_) +
                          "], detection [B] and labels [B]");
  const at::Device dev = confusion_.device();
  const at::Tensor y = labels.to(dev, at::kLong);
  const at::Tensor pred = logits.argmax(1).to(dev);
  const at::Tensor ones = at::ones({y.size(0)}, confusion_.options());
  confusion_.index_put_({y * num_classes_ + pred}, ones, /*accumulate=*/true);
  const at::Tensor det_pred = at::sigmoid(detection.to(at::kFloat)).ge(threshold_).to(dev, at::kLong);
  const at::Tensor det_true = y.eq(positive_class_).to(at::kLong);
  det_confusion_.index_put_({det_true * 2 + det_pred}, ones, /*accumulate=*/true);
  if (loss_sum.defined()) {
    loss_sum_.add_(loss_sum.detach().to(dev, at::kDouble).sum());
    have_loss_ = true;
  }
}

Metrics MetricAccumulator::finish() const {
  const at::Tensor all =
      at::cat({confusion_.to(at::kDouble), det_confusion_.to(at::kDouble), loss_sum_.reshape({1})}).to(at::kCPU);
  const int64_t cc = num_classes_ * num_classes_;
  const at::Tensor conf = all.slice(0, 0, cc).to(at::kLong).reshape({num_classes_, num_classes_});
  const at::Tensor det = all.slice(0, cc, cc + 4).to(at::kLong).reshape({2, 2});
  const double loss = have_loss_ ? all[cc + 4].item<double>() : std::numeric_limits<double>::quiet_NaN();
  Metrics m = metrics_from_counts(conf, det, loss);
  m.has_detection = positive_class_ >= 0;
  return m;
}

void MetricAccumulator::reset() {
  confusion_.zero_();
  det_confusion_.zero_();
  loss_sum_.zero_();
  have_loss_ = false;
}

at::Tensor clip_counts(const at::Tensor& clip, int64_t clips) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(clip.device());
  return at::zeros({clips}, opts).index_add_(0, clip, at::ones({clip.size(0)}, opts));
}

at::Tensor clip_means(const at::Tensor& values, const at::Tensor& clip, const at::Tensor& counts) {
  const at::Tensor v = values.to(at::kDouble);
  return at::zeros({counts.size(0), v.size(1)}, v.options()).index_add_(0, clip, v) / counts.unsqueeze(1);
}

FileScores vote_clips(const at::Tensor& probs, const at::Tensor& det_probs, const at::Tensor& clip, int64_t clips,
                      Vote vote, double threshold) {
  if (probs.dim() != 2 || clip.dim() != 1 || clip.size(0) != probs.size(0) ||
      (det_probs.defined() && (det_probs.dim() != 1 || det_probs.size(0) != probs.size(0))))
    throw InvalidArgument("vote_clips: expected probs [E, C], det_probs [E] (or none) and clip [E]");
  const at::Tensor c = clip.to(probs.device(), at::kLong);
  const at::Tensor counts = clip_counts(c, clips);
  const at::Tensor mean_probs = clip_means(probs, c, counts);
  const at::Tensor det = det_probs.defined() ? det_probs.to(at::kDouble).unsqueeze(1)
                                             : at::zeros({probs.size(0), 1}, mean_probs.options());
  FileScores out;
  if (vote == Vote::mean) {
    out.class_probs = mean_probs;
    out.predicted = mean_probs.argmax(1);
    out.detection_score = clip_means(det, c, counts).squeeze(1);
    out.detected = out.detection_score.ge(threshold);
  } else {
    const at::Tensor votes = at::zeros_like(mean_probs).index_put_(
        {c, probs.argmax(1)}, at::ones({probs.size(0)}, mean_probs.options()), /*accumulate=*/true);
    out.class_probs = votes / counts.unsqueeze(1);
    out.predicted = (votes * 2.0 + mean_probs).argmax(1);
    out.detection_score = clip_means(det.ge(threshold), c, counts).squeeze(1);
    out.detected = out.detection_score.gt(0.5);
  }
  if (!det_probs.defined()) {
    out.detection_score = at::zeros_like(out.detection_score);
    out.detected = at::zeros_like(out.detected);
  }
  out.class_probs = out.class_probs.to(at::kFloat);
  out.detection_score = out.detection_score.to(at::kFloat);
  return out;
}

}  // namespace melforge::trainer
