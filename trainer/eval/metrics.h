#pragma once
/// Classification metrics, accumulated on the device without host syncs, and the file-level vote over a file's
/// segments. The math is plain and tested on hand-computed cases (tests/test_trainer_metrics.cpp).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace melforge::trainer {

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

  /// Every field, per-class scores keyed by class name: {"count", "loss", "accuracy", "macro_f1", "per_class":
  /// {name: {...}}, "confusion", "detection": {...}}.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
  /// The confusion matrix as CSV: a header "true\\pred,<names...>" and one row per true class.
  std::string confusion_csv(const std::vector<std::string>& class_names) const;
};

/// Metrics from counts: `confusion` int64 [C, C] (true, predicted) and `det_confusion` int64 [2, 2], on any
/// device; `loss_sum` is the summed loss over `confusion.sum()` examples (NaN: unknown).
Metrics metrics_from_counts(const at::Tensor& confusion, const at::Tensor& det_confusion, double loss_sum);

/// Accumulates counts on the device of its tensors; only finish() syncs with the host.
class MetricAccumulator {
 public:
  /// `positive_class` in [0, num_classes); `threshold`: detection probability at or above which a segment is
  /// called positive.
  MetricAccumulator(int64_t num_classes, int64_t positive_class, double threshold, at::Device device);
  /// Adds a batch: `logits` [B, C], `detection` logits [B], `labels` int64 [B]; `loss_sum` (a scalar tensor, the
  /// summed loss of the batch) may be undefined.
  void add(const at::Tensor& logits, const at::Tensor& detection, const at::Tensor& labels,
           const at::Tensor& loss_sum = {});
  /// The metrics so far (one host sync).
  Metrics finish() const;
  /// Back to zero.
  void reset();
  /// The accumulator's counts, sharing its storage: confusion int64 [C * C], detection confusion int64 [4] and the
  /// summed loss, double []. Summing them in place over the processes of a data-parallel job makes finish() give
  /// the job's metrics.
  std::vector<at::Tensor> counts() const { return {confusion_, det_confusion_, loss_sum_}; }

 private:
  int64_t num_classes_, positive_class_;
  double threshold_;
  at::Tensor confusion_, det_confusion_, loss_sum_;
  bool have_loss_ = false;
};

/// How a file's long segments are combined.
enum class Vote {
  /// Mean of the long-segment probabilities over the valid long segments.
  mean,
  /// Each valid long segment votes for its argmax class; the most votes wins, ties broken by the mean
  /// probability. The detection head: positive when more than half of the valid long segments are at or above
  /// the threshold; its score is that fraction.
  majority,
};
/// "mean" or "majority"; parse throws InvalidArgument otherwise.
std::string to_string(Vote v);
Vote parse_vote(const std::string& s);

/// Per-file decisions.
struct FileScores {
  /// Class probabilities per file, float32 [F, C] (mean vote: the mean; majority: vote fractions).
  at::Tensor class_probs;
  /// Predicted class per file, int64 [F].
  at::Tensor predicted;
  /// Detection score per file, float32 [F] (mean: mean probability; majority: fraction of positive votes).
  at::Tensor detection_score;
  /// Detection decision per file, bool [F].
  at::Tensor detected;
};

/// File-level decisions from segment outputs. `probs`: softmax probabilities [F, L, S, C]; `det_probs`: sigmoid
/// of the detection logits [F, L, S]; `num_valid_long`: int64 [F] in [1, L] (long segments >= it are ignored).
/// Per long segment the short-segment probabilities are averaged first, then `vote` combines the valid long
/// segments.
FileScores aggregate_files(const at::Tensor& probs, const at::Tensor& det_probs, const at::Tensor& num_valid_long,
                           Vote vote, double threshold);

}  // namespace melforge::trainer
