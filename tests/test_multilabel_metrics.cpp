// Multi-label metrics (kernels/metrics/multilabel.h) against scikit-learn: tests/data/multilabel/cases.json, written
// by tools/gen_multilabel_fixtures.py.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "melforge/common/errors.h"
#include "metrics/multilabel.h"

namespace melforge_test_multilabel_metrics {

namespace metrics = melforge::metrics;

namespace {

constexpr double kTol = 1e-9;

nlohmann::json load_cases() {
  std::ifstream in(std::string(MELFORGE_TEST_DATA_DIR) + "/multilabel/cases.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in)["cases"];
}

/// `got` equals `want` (a number, or null for NaN) within kTol.
void check_value(double got, const nlohmann::json& want, const std::string& what) {
  CAPTURE(what, got, want.dump());
  if (want.is_null()) CHECK(std::isnan(got));
  else CHECK(got == Approx(want.get<double>()).margin(kTol).epsilon(0));
}

void check_f1(const metrics::F1Scores& got, const nlohmann::json& want, const std::string& what) {
  check_value(got.threshold, want["threshold"], what + " threshold");
  check_value(got.micro, want["micro"], what + " micro");
  check_value(got.macro, want["macro"], what + " macro");
  REQUIRE(got.per_class.size() == want["per_class"].size());
  for (std::size_t c = 0; c < got.per_class.size(); ++c)
    check_value(got.per_class[c], want["per_class"][c], what + " class " + std::to_string(c));
}

}  // namespace

TEST_CASE("multi-label metrics equal scikit-learn's on the fixtures", "[metrics][multilabel]") {
  const nlohmann::json cases = load_cases();
  REQUIRE(cases.size() >= 4);
  const std::size_t i = GENERATE_COPY(range(std::size_t{0}, cases.size()));
  const nlohmann::json& c = cases[i];
  CAPTURE(c["name"].get<std::string>());
  const auto scores = c["scores"].get<std::vector<double>>();
  const auto targets = c["targets"].get<std::vector<uint8_t>>();
  const int64_t files = c["files"], classes = c["classes"];
  const nlohmann::json& e = c["expected"];

  const double tuned = metrics::tune_threshold(scores, targets);
  check_value(tuned, e["tuned_threshold"], "tuned threshold");
  const metrics::MultilabelMetrics m =
      metrics::multilabel_metrics(scores, targets, files, classes, c["threshold"].get<double>(), tuned);
  REQUIRE(m.ap.size() == static_cast<std::size_t>(classes));
  for (int64_t k = 0; k < classes; ++k) {
    check_value(m.ap[static_cast<std::size_t>(k)], e["ap"][k], "AP of class " + std::to_string(k));
    check_value(m.auc[static_cast<std::size_t>(k)], e["auc"][k], "AUC of class " + std::to_string(k));
  }
  check_value(m.map_macro, e["map_macro"], "mAP macro");
  check_value(m.map_micro, e["map_micro"], "mAP micro");
  check_value(m.auc_macro, e["auc_macro"], "AUC macro");
  check_f1(m.f1, e["f1"], "F1");
  REQUIRE(m.has_tuned);
  check_f1(m.f1_tuned, e["f1_tuned"], "tuned F1");
}

TEST_CASE("multi-label metrics: undefined classes, JSON nulls, size errors", "[metrics][multilabel]") {
  const std::vector<double> s = {0.2, 0.9, 0.4, 0.1};
  CHECK(std::isnan(metrics::average_precision(s, {0, 0, 0, 0})));
  CHECK(metrics::average_precision(s, {1, 1, 1, 1}) == 1.0);
  CHECK(std::isnan(metrics::roc_auc(s, {1, 1, 1, 1})));
  CHECK(std::isnan(metrics::roc_auc(s, {0, 0, 0, 0})));
  CHECK(metrics::roc_auc({0.5, 0.5}, {0, 1}) == 0.5);
  CHECK_THROWS_AS(metrics::average_precision(s, {1, 0}), melforge::InvalidArgument);
  CHECK_THROWS_AS(metrics::f1_scores(s, {1, 0, 1, 0}, 3, 2, 0.5), melforge::InvalidArgument);

  const auto m = metrics::multilabel_metrics({0.9, 0.1, 0.8, 0.3}, {1, 0, 0, 0}, 2, 2, 0.5);
  CHECK(m.ap_undefined == 1);
  CHECK(m.auc_undefined == 1);
  CHECK(m.map_macro == 1.0);
  const nlohmann::json j = m.to_json({"a", "b"});
  CHECK(j["per_class"]["b"]["ap"].is_null());
  CHECK(j["per_class"]["a"]["positives"] == 1);
  CHECK_FALSE(j.contains("f1_tuned"));
}

}  // namespace melforge_test_multilabel_metrics
