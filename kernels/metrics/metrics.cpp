#include "metrics/metrics.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "melforge/common/csv.h"
#include "melforge/common/errors.h"

namespace melforge::metrics {

namespace {

double ratio(int64_t num, int64_t den) { return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0; }

double f1_of(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0.0; }

bool is_square(const std::vector<std::vector<int64_t>>& m, std::size_t n) {
  if (m.size() != n) return false;
  for (const auto& row : m)
    if (row.size() != n) return false;
  return true;
}

}  // namespace

Metrics metrics_from_confusion(std::vector<std::vector<int64_t>> confusion,
                               std::vector<std::vector<int64_t>> det_confusion, double loss_sum) {
  if (!is_square(confusion, confusion.size()))
    throw InvalidArgument("metrics_from_counts: confusion must be [C, C]");
  if (!is_square(det_confusion, 2)) throw InvalidArgument("metrics_from_counts: det_confusion must be [2, 2]");
  Metrics m;
  m.confusion = std::move(confusion);
  m.det_confusion = std::move(det_confusion);
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

Metrics file_metrics(const std::vector<int64_t>& labels, const std::vector<int64_t>& predicted,
                     const std::vector<uint8_t>& detected, int64_t num_classes, int64_t positive_class) {
  if (num_classes < 1) throw InvalidArgument("file_metrics: num_classes must be >= 1");
  if (predicted.size() != labels.size() || detected.size() != labels.size())
    throw InvalidArgument("file_metrics: labels, predicted and detected must have the same length (" +
                          std::to_string(labels.size()) + ", " + std::to_string(predicted.size()) + ", " +
                          std::to_string(detected.size()) + ")");
  const auto C = static_cast<std::size_t>(num_classes);
  std::vector<std::vector<int64_t>> conf(C, std::vector<int64_t>(C, 0));
  std::vector<std::vector<int64_t>> det(2, std::vector<int64_t>(2, 0));
  for (std::size_t f = 0; f < labels.size(); ++f) {
    if (labels[f] < 0 || labels[f] >= num_classes || predicted[f] < 0 || predicted[f] >= num_classes)
      throw InvalidArgument("file_metrics: file " + std::to_string(f) + " has label " + std::to_string(labels[f]) +
                            " and prediction " + std::to_string(predicted[f]) + ", outside [0, " +
                            std::to_string(num_classes) + ")");
    conf[static_cast<std::size_t>(labels[f])][static_cast<std::size_t>(predicted[f])] += 1;
    det[labels[f] == positive_class ? 1 : 0][detected[f] ? 1 : 0] += 1;
  }
  Metrics m = metrics_from_confusion(std::move(conf), std::move(det), std::numeric_limits<double>::quiet_NaN());
  m.has_detection = positive_class >= 0;
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
                      {"confusion", confusion}};
  if (has_detection)
    j["detection"] = {{"accuracy", det_accuracy},
                      {"precision", det_precision},
                      {"recall", det_recall},
                      {"f1", det_f1},
                      {"confusion", det_confusion}};
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

}  // namespace melforge::metrics
