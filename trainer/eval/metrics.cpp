#include "eval/metrics.h"

#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "melforge/common/errors.h"
#include "util.h"

namespace melforge::trainer {

namespace {

double ratio(int64_t num, int64_t den) { return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0; }

double f1_of(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0.0; }

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
  Metrics m;
  m.confusion = to_rows(confusion);
  m.det_confusion = to_rows(det_confusion);
  const std::size_t C = m.confusion.size();
  int64_t correct = 0;
  std::vector<int64_t> predicted(C, 0);
  for (std::size_t t = 0; t < C; ++t) {
    for (std::size_t p = 0; p < C; ++p) {
      m.count += m.confusion[t][p];
      predicted[p] += m.confusion[t][p];
    }
    correct += m.confusion[t][t];
  }
  m.loss = m.count > 0 ? loss_sum / static_cast<double>(m.count) : std::numeric_limits<double>::quiet_NaN();
  m.accuracy = ratio(correct, m.count);
  m.per_class.resize(C);
  int64_t supported = 0;
  double f1_sum = 0;
  for (std::size_t c = 0; c < C; ++c) {
    ClassScores& s = m.per_class[c];
    for (std::size_t p = 0; p < C; ++p) s.support += m.confusion[c][p];
    s.precision = ratio(m.confusion[c][c], predicted[c]);
    s.recall = ratio(m.confusion[c][c], s.support);
    s.f1 = f1_of(s.precision, s.recall);
    if (s.support > 0) {
      ++supported;
      f1_sum += s.f1;
    }
  }
  m.macro_f1 = supported > 0 ? f1_sum / static_cast<double>(supported) : 0.0;
  const auto& d = m.det_confusion;
  const int64_t tn = d[0][0], fp = d[0][1], fn = d[1][0], tp = d[1][1];
  m.det_accuracy = ratio(tp + tn, tn + fp + fn + tp);
  m.det_precision = ratio(tp, tp + fp);
  m.det_recall = ratio(tp, tp + fn);
  m.det_f1 = f1_of(m.det_precision, m.det_recall);
  return m;
}

nlohmann::json Metrics::to_json(const std::vector<std::string>& class_names) const {
  nlohmann::json per = nlohmann::json::object();
  for (std::size_t c = 0; c < per_class.size(); ++c) {
    const std::string name = c < class_names.size() ? class_names[c] : std::to_string(c);
    per[name] = {{"precision", per_class[c].precision},
                 {"recall", per_class[c].recall},
                 {"f1", per_class[c].f1},
                 {"support", per_class[c].support}};
  }
  nlohmann::json j = {{"count", count},
                      {"loss", std::isnan(loss) ? nlohmann::json(nullptr) : nlohmann::json(loss)},
                      {"accuracy", accuracy},
                      {"macro_f1", macro_f1},
                      {"per_class", per},
                      {"confusion", confusion},
                      {"detection",
                       {{"accuracy", det_accuracy},
                        {"precision", det_precision},
                        {"recall", det_recall},
                        {"f1", det_f1},
                        {"confusion", det_confusion}}}};
  return j;
}

std::string Metrics::confusion_csv(const std::vector<std::string>& class_names) const {
  auto name = [&](std::size_t c) { return c < class_names.size() ? class_names[c] : std::to_string(c); };
  std::ostringstream out;
  out << "true\\pred";
  for (std::size_t p = 0; p < confusion.size(); ++p) out << ',' << csv_field(name(p));
  out << '\n';
  for (std::size_t t = 0; t < confusion.size(); ++t) {
    out << csv_field(name(t));
    for (int64_t v : confusion[t]) out << ',' << v;
    out << '\n';
  }
  return out.str();
}

MetricAccumulator::MetricAccumulator(int64_t num_classes, int64_t positive_class, double threshold, at::Device device)
    : num_classes_(num_classes), positive_class_(positive_class), threshold_(threshold) {
  if (num_classes < 1) throw InvalidArgument("MetricAccumulator: num_classes must be >= 1");
  if (positive_class < 0 || positive_class >= num_classes)
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
  return metrics_from_counts(conf, det, loss);
}

void MetricAccumulator::reset() {
  confusion_.zero_();
  det_confusion_.zero_();
  loss_sum_.zero_();
  have_loss_ = false;
}

std::string to_string(Vote v) { return v == Vote::mean ? "mean" : "majority"; }

Vote parse_vote(const std::string& s) {
  if (s == "mean") return Vote::mean;
  if (s == "majority") return Vote::majority;
  throw InvalidArgument("--vote: '" + s + "' is not one of mean, majority");
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
