#include "metrics/multilabel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "melforge/common/errors.h"

namespace melforge::metrics {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_sizes(std::size_t scores, std::size_t targets, const char* what) {
  if (scores != targets)
    throw InvalidArgument(std::string(what) + ": " + std::to_string(scores) + " scores but " +
                          std::to_string(targets) + " targets");
}

/// Cumulative (true positives, false positives) at each distinct score, scores taken in descending order: entry k
/// counts every pair whose score is >= the k-th largest distinct score; `thresholds` gets those scores.
void cumulative_counts(const std::vector<double>& scores, const std::vector<uint8_t>& targets,
                       std::vector<double>& tps, std::vector<double>& fps, std::vector<double>* thresholds = nullptr) {
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&scores](std::size_t a, std::size_t b) { return scores[a] > scores[b]; });
  double tp = 0, fp = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    (targets[order[i]] ? tp : fp) += 1;
    if (i + 1 == order.size() || scores[order[i + 1]] != scores[order[i]]) {
      tps.push_back(tp);
      fps.push_back(fp);
      if (thresholds) thresholds->push_back(scores[order[i]]);
    }
  }
}

double nan_mean(const std::vector<double>& v, int64_t& undefined) {
  double sum = 0;
  int64_t n = 0;
  undefined = 0;
  for (const double x : v) {
    if (std::isnan(x)) ++undefined;
    else sum += x, ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : kNaN;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

double average_precision(const std::vector<double>& scores, const std::vector<uint8_t>& targets) {
  check_sizes(scores.size(), targets.size(), "average_precision");
  std::vector<double> tps, fps;
  cumulative_counts(scores, targets, tps, fps);
  const double positives = tps.empty() ? 0 : tps.back();
  if (positives == 0) return kNaN;
  double ap = 0, prev_recall = 0;
  for (std::size_t k = 0; k < tps.size(); ++k) {
    const double recall = tps[k] / positives;
    ap += (recall - prev_recall) * (tps[k] / (tps[k] + fps[k]));
    prev_recall = recall;
  }
  return ap;
}

double roc_auc(const std::vector<double>& scores, const std::vector<uint8_t>& targets) {
  check_sizes(scores.size(), targets.size(), "roc_auc");
  std::vector<double> tps, fps;
  cumulative_counts(scores, targets, tps, fps);
  const double positives = tps.empty() ? 0 : tps.back(), negatives = fps.empty() ? 0 : fps.back();
  if (positives == 0 || negatives == 0) return kNaN;
  double area = 0, prev_tpr = 0, prev_fpr = 0;
  for (std::size_t k = 0; k < tps.size(); ++k) {
    const double tpr = tps[k] / positives, fpr = fps[k] / negatives;
    area += (fpr - prev_fpr) * (tpr + prev_tpr) / 2;
    prev_tpr = tpr;
    prev_fpr = fpr;
  }
  return area;
}

nlohmann::json F1Scores::to_json(const std::vector<std::string>& class_names) const {
  nlohmann::json per = nlohmann::json::object();
  for (std::size_t c = 0; c < per_class.size() && c < class_names.size(); ++c) per[class_names[c]] = per_class[c];
  return {{"threshold", threshold}, {"micro", micro}, {"macro", macro}, {"per_class", per}};
}

F1Scores f1_scores(const std::vector<double>& scores, const std::vector<uint8_t>& targets, int64_t files,
                   int64_t classes, double threshold) {
  check_sizes(scores.size(), targets.size(), "f1_scores");
  if (files < 0 || classes < 0 || static_cast<int64_t>(scores.size()) != files * classes)
    throw InvalidArgument("f1_scores: " + std::to_string(scores.size()) + " scores for " + std::to_string(files) +
                          " files x " + std::to_string(classes) + " classes");
  F1Scores r;
  r.threshold = threshold;
  r.per_class.assign(static_cast<std::size_t>(classes), 0.0);
  int64_t tp_all = 0, wrong_all = 0;
  for (int64_t c = 0; c < classes; ++c) {
    int64_t tp = 0, wrong = 0;
    for (int64_t f = 0; f < files; ++f) {
      const auto i = static_cast<std::size_t>(f * classes + c);
      const bool predicted = scores[i] >= threshold, actual = targets[i] != 0;
      tp += predicted && actual;
      wrong += predicted != actual;
    }
    if (2 * tp + wrong > 0) r.per_class[static_cast<std::size_t>(c)] = 2.0 * tp / static_cast<double>(2 * tp + wrong);
    tp_all += tp;
    wrong_all += wrong;
  }
  r.macro = classes > 0 ? std::accumulate(r.per_class.begin(), r.per_class.end(), 0.0) / static_cast<double>(classes)
                        : 0.0;
  r.micro = 2 * tp_all + wrong_all > 0 ? 2.0 * tp_all / static_cast<double>(2 * tp_all + wrong_all) : 0.0;
  return r;
}

double tune_threshold(const std::vector<double>& scores, const std::vector<uint8_t>& targets) {
  check_sizes(scores.size(), targets.size(), "tune_threshold");
  std::vector<double> tps, fps, thresholds;
  cumulative_counts(scores, targets, tps, fps, &thresholds);
  if (thresholds.empty()) return 0.5;
  const double positives = tps.back();
  double best = -1, best_threshold = thresholds.front();
  for (std::size_t k = 0; k < tps.size(); ++k) {
    const double denom = tps[k] + fps[k] + positives;
    const double f1 = denom > 0 ? 2 * tps[k] / denom : 0.0;
    if (f1 > best) {
      best = f1;
      best_threshold = thresholds[k];
    }
  }
  return best_threshold;
}

nlohmann::json MultilabelMetrics::to_json(const std::vector<std::string>& class_names) const {
  nlohmann::json per = nlohmann::json::object();
  for (std::size_t c = 0; c < ap.size() && c < class_names.size(); ++c)
    per[class_names[c]] = {{"ap", num(ap[c])}, {"auc", num(auc[c])}, {"positives", positives[c]},
                           {"f1", f1.per_class[c]}};
  nlohmann::json j = {{"files", files},
                      {"classes", classes},
                      {"loss", num(loss)},
                      {"map_macro", num(map_macro)},
                      {"map_micro", num(map_micro)},
                      {"auc_macro", num(auc_macro)},
                      {"ap_undefined_classes", ap_undefined},
                      {"auc_undefined_classes", auc_undefined},
                      {"per_class", per},
                      {"f1", f1.to_json(class_names)}};
  if (has_tuned) j["f1_tuned"] = f1_tuned.to_json(class_names);
  return j;
}

MultilabelMetrics multilabel_metrics(const std::vector<double>& scores, const std::vector<uint8_t>& targets,
                                     int64_t files, int64_t classes, double threshold, double tuned_threshold,
                                     double loss) {
  MultilabelMetrics m;
  m.f1 = f1_scores(scores, targets, files, classes, threshold);
  m.files = files;
  m.classes = classes;
  m.loss = loss;
  std::vector<double> s(static_cast<std::size_t>(files));
  std::vector<uint8_t> t(static_cast<std::size_t>(files));
  for (int64_t c = 0; c < classes; ++c) {
    for (int64_t f = 0; f < files; ++f) {
      s[static_cast<std::size_t>(f)] = scores[static_cast<std::size_t>(f * classes + c)];
      t[static_cast<std::size_t>(f)] = targets[static_cast<std::size_t>(f * classes + c)] != 0;
    }
    m.positives.push_back(std::count(t.begin(), t.end(), uint8_t{1}));
    m.ap.push_back(average_precision(s, t));
    m.auc.push_back(roc_auc(s, t));
  }
  m.map_macro = nan_mean(m.ap, m.ap_undefined);
  m.auc_macro = nan_mean(m.auc, m.auc_undefined);
  std::vector<uint8_t> all(targets.size());
  for (std::size_t i = 0; i < targets.size(); ++i) all[i] = targets[i] != 0;
  m.map_micro = average_precision(scores, all);
  if (tuned_threshold >= 0) {
    m.f1_tuned = f1_scores(scores, targets, files, classes, tuned_threshold);
    m.has_tuned = true;
  }
  return m;
}

}  // namespace melforge::metrics
