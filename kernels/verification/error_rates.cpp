#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "melforge/common/errors.h"
#include "verification/verification.h"

namespace melforge::verification {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

std::vector<DetPoint> det_curve(const std::vector<float>& scores, const std::vector<uint8_t>& targets) {
  if (scores.size() != targets.size())
    throw InvalidArgument("det_curve: " + std::to_string(scores.size()) + " scores but " +
                          std::to_string(targets.size()) + " targets");
  double positives = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) throw InvalidArgument("det_curve: score " + std::to_string(i) + " is NaN");
    positives += targets[i] != 0;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0)
    throw InvalidArgument("det_curve: the trials need targets and non-targets, got " +
                          std::to_string(static_cast<int64_t>(positives)) + " and " +
                          std::to_string(static_cast<int64_t>(negatives)));
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&scores](std::size_t a, std::size_t b) { return scores[a] > scores[b]; });
  std::vector<DetPoint> det = {{kInf, 0.0, 1.0}};
  double tp = 0, fp = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    (targets[order[i]] ? tp : fp) += 1;
    if (i + 1 == order.size() || scores[order[i + 1]] != scores[order[i]])
      det.push_back({static_cast<double>(scores[order[i]]), fp / negatives, 1.0 - tp / positives});
  }
  return det;
}

double equal_error_rate(const std::vector<DetPoint>& det, double* threshold) {
  if (det.empty() || !(det.front().p_miss > det.front().p_fa))
    throw InvalidArgument("equal_error_rate: the DET curve must start with p_miss > p_fa (the +inf point)");
  for (std::size_t k = 1; k < det.size(); ++k) {
    const double d = det[k].p_miss - det[k].p_fa;
    if (d > 0) continue;
    if (threshold) *threshold = det[k].threshold;
    if (d == 0) return det[k].p_fa;
    const double d_prev = det[k - 1].p_miss - det[k - 1].p_fa, t = d_prev / (d_prev - d);
    return det[k - 1].p_fa + t * (det[k].p_fa - det[k - 1].p_fa);
  }
  throw InvalidArgument("equal_error_rate: the DET curve never reaches p_fa >= p_miss");
}

double min_dcf(const std::vector<DetPoint>& det, double p_target, double c_miss, double c_fa, double* threshold) {
  if (det.empty()) throw InvalidArgument("min_dcf: empty DET curve");
  if (!(p_target > 0 && p_target < 1) || !(c_miss > 0) || !(c_fa > 0))
    throw InvalidArgument("min_dcf: p_target must be in (0, 1) and the costs > 0, got p_target " +
                          std::to_string(p_target) + ", c_miss " + std::to_string(c_miss) + ", c_fa " +
                          std::to_string(c_fa));
  double best = kInf;
  for (const DetPoint& p : det) {
    const double c = c_miss * p_target * p.p_miss + c_fa * (1 - p_target) * p.p_fa;
    if (c < best) {
      best = c;
      if (threshold) *threshold = p.threshold;
    }
  }
  return best / std::min(c_miss * p_target, c_fa * (1 - p_target));
}

ErrorRates error_rates(const std::vector<float>& scores, const std::vector<uint8_t>& targets) {
  const std::vector<DetPoint> det = det_curve(scores, targets);
  ErrorRates r;
  r.eer = equal_error_rate(det, &r.eer_threshold);
  r.min_dcf_01 = min_dcf(det, 0.01, 1, 1, &r.min_dcf_01_threshold);
  r.min_dcf_05 = min_dcf(det, 0.05, 1, 1, &r.min_dcf_05_threshold);
  r.targets = static_cast<int64_t>(std::count_if(targets.begin(), targets.end(), [](uint8_t t) { return t != 0; }));
  r.nontargets = static_cast<int64_t>(targets.size()) - r.targets;
  return r;
}

nlohmann::json ErrorRates::to_json() const {
  return {{"eer", eer},
          {"eer_percent", 100 * eer},
          {"eer_threshold", finite_or_null(eer_threshold)},
          {"min_dcf_0.01", min_dcf_01},
          {"min_dcf_0.05", min_dcf_05},
          {"min_dcf_0.01_threshold", finite_or_null(min_dcf_01_threshold)},
          {"min_dcf_0.05_threshold", finite_or_null(min_dcf_05_threshold)},
          {"targets", targets},
          {"nontargets", nontargets}};
}

}  // namespace melforge::verification
