#pragma once
/// Classification metrics from confusion counts: accuracy, per-class precision / recall / F1, macro-F1 and the
/// binary detection head's scores, as `melforge-train eval` reports them. Plain C++ (no LibTorch): the trainer
/// (eval/metrics.h) and the Python package (melforge.evaluate_files) both compute their reports here.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace melforge::metrics {

/// Precision, recall and F1 of one class (0 where undefined: no prediction or no example of it).
struct ClassScores {
  double precision = 0;
  double recall = 0;
  double f1 = 0;
  /// Examples whose true class is this one.
  int64_t support = 0;
};

/// The metrics of one evaluation, at segment or at file level.
struct Metrics {
  /// Examples counted (segments or files).
  int64_t count = 0;
  /// Mean combined loss per example; NaN when no loss was accumulated (file level).
  double loss = 0;
  /// Multi-class accuracy in [0, 1].
  double accuracy = 0;
  /// Per class, indexed by label.
  std::vector<ClassScores> per_class;
  /// Unweighted mean of the per-class F1 over classes with support > 0.
  double macro_f1 = 0;
  /// confusion[t][p]: examples of true class t predicted as p.
  std::vector<std::vector<int64_t>> confusion;
  /// Binary detection head (positive class vs the rest): accuracy, and precision/recall/F1 of "positive".
  double det_accuracy = 0;
  double det_precision = 0;
  double det_recall = 0;
  double det_f1 = 0;
  /// det_confusion[t][p] with 0 = negative, 1 = positive.
  std::vector<std::vector<int64_t>> det_confusion;
  /// False when the run has no detection head (`--positive-class none`): the det_* fields mean nothing and
  /// to_json leaves "detection" out.
  bool has_detection = true;

  /// Every field, per-class scores keyed by class name: {"count", "loss", "accuracy", "macro_f1", "per_class":
  /// {name: {...}}, "confusion", "detection": {...}}.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
  /// The confusion matrix as CSV: a header "true\\pred,<names...>" and one row per true class.
  std::string confusion_csv(const std::vector<std::string>& class_names) const;
};

/// Metrics from counts: `confusion` [C][C] (true, predicted), `det_confusion` [2][2] (0 = negative, 1 = positive);
/// `loss_sum` is the summed loss over all counted examples (NaN: unknown). Throws InvalidArgument when a matrix is
/// not square or det_confusion is not 2 x 2.
Metrics metrics_from_confusion(std::vector<std::vector<int64_t>> confusion,
                               std::vector<std::vector<int64_t>> det_confusion, double loss_sum);

/// File-level metrics of per-file decisions: `labels`, `predicted` [F] in [0, num_classes), `detected` [F] (0/1);
/// a file is a detection positive when its label is `positive_class` (-1: no detection head, has_detection false).
/// Loss is NaN. Throws InvalidArgument on
/// mismatched sizes or a label / prediction outside [0, num_classes).
Metrics file_metrics(const std::vector<int64_t>& labels, const std::vector<int64_t>& predicted,
                     const std::vector<uint8_t>& detected, int64_t num_classes, int64_t positive_class);

}  // namespace melforge::metrics
