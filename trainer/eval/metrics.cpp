#include "eval/metrics.h"

#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>

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

FileScores aggregate_files(const at::Tensor& probs, const at::Tensor& det_probs, const at::Tensor& num_valid_long,
                           Vote vote, double threshold) {
  if (probs.dim() != 4 || det_probs.dim() != 3 || num_valid_long.dim() != 1 ||
      det_probs.sizes() != probs.sizes().slice(0, 3) || num_valid_long.size(0) != probs.size(0))
    throw InvalidArgument("aggregate_files: expected probs [F, L, S, C], det_probs [F, L, S], num_valid_long [F]");
  const int64_t L = probs.size(1), C = probs.size(3);
  const at::Device dev = probs.device();
  const at::Tensor nvl = num_valid_long.to(dev, at::kLong);
  const at::Tensor mask = at::arange(L, nvl.options()).unsqueeze(0).lt(nvl.unsqueeze(1));
  const at::Tensor maskd = mask.to(at::kDouble);
  const at::Tensor n = nvl.to(at::kDouble);
  const at::Tensor long_probs = probs.to(at::kDouble).mean(2);
  const at::Tensor long_det = det_probs.to(at::kDouble).mean(2);
  const at::Tensor mean_probs = (long_probs * maskd.unsqueeze(2)).sum(1) / n.unsqueeze(1);

  FileScores out;
  if (vote == Vote::mean) {
    out.class_probs = mean_probs;
    out.predicted = mean_probs.argmax(1);
    out.detection_score = (long_det * maskd).sum(1) / n;
    out.detected = out.detection_score.ge(threshold);
  } else {
    const at::Tensor votes = at::zeros({probs.size(0), C}, long_probs.options())
                                 .scatter_add_(1, long_probs.argmax(2), maskd);
    out.class_probs = votes / n.unsqueeze(1);
    out.predicted = (votes * 2.0 + mean_probs).argmax(1);
    out.detection_score = (long_det.ge(threshold).to(at::kDouble) * maskd).sum(1) / n;
    out.detected = out.detection_score.gt(0.5);
  }
  out.class_probs = out.class_probs.to(at::kFloat);
  out.detection_score = out.detection_score.to(at::kFloat);
  return out;
}

}  // namespace melforge::trainer
