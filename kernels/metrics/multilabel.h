#pragma once
/// Multi-label metrics from per-file, per-class scores: average precision (per class, macro and micro mAP), ROC-AUC
/// (per class and macro) and F1 (micro and macro) at a threshold, with scikit-learn's definitions. Plain C++ (no
/// LibTorch): `melforge-train eval` and train's validation of `--task multilabel` report these.
///
/// Conventions (checked against scikit-learn by tests/test_multilabel_metrics.cpp on fixtures that
/// tools/gen_multilabel_fixtures.py writes):
/// - AP is sklearn's average_precision_score: sum over distinct thresholds (descending) of (R_k - R_{k-1}) * P_k,
///   step-wise, no interpolation. ROC-AUC is sklearn's roc_auc_score: trapezoid under the ROC curve over distinct
///   thresholds (tied scores form one step, a diagonal segment).
/// - A class without a positive in the split has no AP (NaN), and one without a positive or without a negative has
///   no ROC-AUC (NaN); NaN classes are left out of the macro averages (sklearn would give AP 0 and raise for AUC).
///   A macro average over no class is NaN. Micro AP pools every (file, class) pair (sklearn's average="micro").
/// - F1 follows sklearn's f1_score with zero_division=0: a file carries a class when its score is >= the
///   threshold; per class F1 = 2 TP / (2 TP + FP + FN), 0 when TP + FP + FN = 0; macro F1 averages every class
///   (those with F1 0 included); micro F1 pools the counts of all classes.
/// - The tuned threshold is one global threshold (not per class): the score s among the pairs' distinct scores
///   whose rule "score >= s" gives the highest micro F1, the largest such s on a tie; 0.5 when there are no scores.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace melforge::metrics {

/// Average precision of `scores` against binary `targets` (same length, 1 = positive), sklearn's definition; NaN
/// when no target is positive. Throws InvalidArgument on mismatched sizes.
double average_precision(const std::vector<double>& scores, const std::vector<uint8_t>& targets);

/// Area under the ROC curve of `scores` against `targets`, sklearn's definition (ties: trapezoid); NaN unless both
/// a positive and a negative are present. Throws InvalidArgument on mismatched sizes.
double roc_auc(const std::vector<double>& scores, const std::vector<uint8_t>& targets);

/// F1 scores at one threshold.
struct F1Scores {
  /// The threshold: a pair is predicted positive when its score is >= it.
  double threshold = 0.5;
  /// Per class, [classes] (0 when the class has no true and no predicted positive).
  std::vector<double> per_class;
  /// Mean of per_class over every class.
  double macro = 0;
  /// 2 TP / (2 TP + FP + FN) over every pair.
  double micro = 0;

  /// {"threshold", "micro", "macro", "per_class": {name: f1}}.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
};

/// F1 at `threshold` of row-major `scores` and `targets` [files, classes]. Throws InvalidArgument on sizes that do
/// not match files * classes.
F1Scores f1_scores(const std::vector<double>& scores, const std::vector<uint8_t>& targets, int64_t files,
                   int64_t classes, double threshold);

/// The global threshold that maximises micro F1 of `scores` against `targets` (any layout, same length): see the
/// file comment. Throws InvalidArgument on mismatched sizes.
double tune_threshold(const std::vector<double>& scores, const std::vector<uint8_t>& targets);

/// Every multi-label metric of one split.
struct MultilabelMetrics {
  /// Files and classes evaluated.
  int64_t files = 0;
  int64_t classes = 0;
  /// Mean loss per example (the caller's; NaN when unknown).
  double loss = 0;
  /// Positive files per class, [classes].
  std::vector<int64_t> positives;
  /// Average precision per class, [classes], NaN for a class without a positive.
  std::vector<double> ap;
  /// ROC-AUC per class, [classes], NaN for a class without a positive or without a negative.
  std::vector<double> auc;
  /// Mean of the defined per-class AP (NaN when none is defined).
  double map_macro = 0;
  /// AP of every (file, class) pair pooled.
  double map_micro = 0;
  /// Mean of the defined per-class ROC-AUC (NaN when none is defined).
  double auc_macro = 0;
  /// Classes left out of map_macro (no positive) and of auc_macro (no positive or no negative).
  int64_t ap_undefined = 0;
  int64_t auc_undefined = 0;
  /// F1 at the chosen threshold.
  F1Scores f1;
  /// F1 at the tuned threshold (threshold tuned on another split, e.g. val for test); absent when has_tuned is false.
  F1Scores f1_tuned;
  bool has_tuned = false;

  /// {"files", "classes", "loss", "map_macro", "map_micro", "auc_macro", "ap_undefined_classes",
  /// "auc_undefined_classes", "per_class": {name: {"ap", "auc", "positives", "f1"}}, "f1": {...}, "f1_tuned":
  /// {...} when has_tuned}; NaN written as null.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
};

/// Every metric of row-major `scores` and `targets` [files, classes] with F1 at `threshold`; `tuned_threshold` >= 0
/// also gives f1_tuned at it. `loss` is copied. Throws InvalidArgument on mismatched sizes.
MultilabelMetrics multilabel_metrics(const std::vector<double>& scores, const std::vector<uint8_t>& targets,
                                     int64_t files, int64_t classes, double threshold, double tuned_threshold = -1,
                                     double loss = 0);

}  // namespace melforge::metrics
