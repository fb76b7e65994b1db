#pragma once
/// Evaluation of a model on a split: segment-level metrics over every valid short segment, and file-level metrics
/// from many files per forward pass (aggregate_files).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/metrics.h"
#include "metrics/multilabel.h"
#include "verification/verification.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

class Classifier;
struct Split;

/// Evaluation settings, shared by `eval`, the per-epoch validation of `train`, and `predict`.
struct EvalOptions {
  /// Split to evaluate: train, val or test (`eval` only).
  std::string split = "test";
  /// Short segments per forward pass (whole files are packed into it, at least one file per pass).
  int64_t batch_size = 1024;
  /// File-level vote over long segments: mean or majority.
  std::string vote = "mean";
  /// Detection probability at or above which the binary head says "positive", in (0, 1); with --task multilabel,
  /// the class probability at or above which a file carries a class.
  double threshold = 0.5;
  /// --task multilabel: how a file's segment probabilities become its per-class score: mean or max.
  std::string aggregate = "mean";

  /// Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --split --eval-batch-size --vote --threshold --aggregate.
void add_options(boost::program_options::options_description& desc, EvalOptions& opts);

/// The result of one evaluation.
struct EvalResult {
  /// Over every valid short segment (loss included).
  Metrics segment;
  /// Over files (loss NaN).
  Metrics file;
  /// Per-file decisions, on the CPU, in the split's file order.
  FileScores files;
  /// Wall time of the evaluation, seconds; and files per second.
  double seconds = 0;
  double files_per_s = 0;
  /// --task multilabel: true, and `multilabel` holds the metrics (`segment.loss` the mean BCE per segment; the
  /// other multi-class fields stay empty) and `file_scores` the per-file class probabilities, float32 CPU [F, C].
  bool is_multilabel = false;
  metrics::MultilabelMetrics multilabel;
  at::Tensor file_scores;
  /// --task verification: true, and `verification` holds the error rates of the scored trials, `det` their DET
  /// curve and `file_scores` the per-file embeddings, float32 CPU [F, E] (the multi-class fields stay empty).
  bool is_verification = false;
  verification::ErrorRates verification;
  std::vector<verification::DetPoint> det;

  /// {"segment": ..., "file": ..., "seconds", "files_per_s"}; multi-label: {"multilabel": ..., "seconds",
  /// "files_per_s"}; verification: {"verification": ErrorRates::to_json(), "seconds", "files_per_s"}.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
};

/// Evaluates `model` (put in eval mode, no autograd; its mode is restored afterwards) on `split` with the
/// combined loss of models/model.h (`positive_class`, `bce_weight`). The split's data are moved to `device`
/// batch by batch; `autocast` (at::kBFloat16 / at::kHalf, or at::kFloat for none) sets the forward's precision.
/// One host sync at the end. Throws FormatError when the split is empty.
EvalResult evaluate(Classifier& model, const Split& split, int64_t positive_class, double bce_weight,
                    const EvalOptions& opts, at::Device device, at::ScalarType autocast = at::kFloat);

/// The first file (0-based row of its split) whose class probabilities or detection score in `result` are NaN or
/// infinite (its model output was not finite), or -1 when every file's are finite.
int64_t first_non_finite_file(const EvalResult& result);

}  // namespace melforge::trainer
