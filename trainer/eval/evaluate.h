#pragma once
/// Evaluation of a model on a split: every frame of every clip is scored. The split is read through its evaluation
/// view (eval/batching.h: the tiles the model was trained on with min_real 0, the last tile of a clip padded and
/// masked; whole clips for speaker models), tile-level metrics over every example, and clip-level (file) metrics from
/// the vote over each clip's examples (vote_clips).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/batching.h"
#include "eval/metrics.h"
#include "metrics/multilabel.h"
#include "verification/verification.h"
#include "views/view_options.h"

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
  /// Examples (tiles) per forward pass; whole clips are batched by length under view.clip_batch_seconds instead.
  int64_t batch_size = 1024;
  /// Clip-level vote over the clip's tiles: mean or majority.
  std::string vote = "mean";
  /// Detection probability at or above which the binary head says "positive", in (0, 1); with --task multilabel,
  /// the class probability at or above which a file carries a class.
  double threshold = 0.5;
  /// --task multilabel: how a clip's tile probabilities become its per-class score: mean or max.
  std::string aggregate = "mean";
  /// The view the model was trained through (resolved: resolve_view_options). Not a flag of this group: `train` sets
  /// it from its own view flags, `eval` from the checkpoint. The evaluation reads the same tiles with min_real 0
  /// (evaluation_view_options): every frame of every clip.
  data::views::ViewOptions view;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --split --eval-batch-size --vote --threshold --aggregate.
void add_options(boost::program_options::options_description& desc, EvalOptions& opts);

/// Classes up to which report.json holds the full C x C confusion matrices and the confusion CSVs are written:
/// 1,000 (a million cells, about 10 MB of JSON a matrix). Beyond, each matrix is summarised (metrics_json).
inline constexpr int64_t kMaxFullConfusionClasses = 1000;

/// Off-diagonal confusions listed for a matrix of more than kMaxFullConfusionClasses classes.
inline constexpr std::size_t kTopConfusions = 1000;

/// `m.to_json(class_names)`, except beyond kMaxFullConfusionClasses classes: "confusion" is left out, and
/// "confusion_top" lists the kTopConfusions largest off-diagonal cells ({"true", "predicted", "count"}, largest
/// first) with "confusion_note" saying so.
nlohmann::json metrics_json(const metrics::Metrics& m, const std::vector<std::string>& class_names);


/// The result of one evaluation.
struct EvalResult {
  /// Over every example of the evaluation view, the tiles (loss included); "tiles" in the report (schema 1/2: the
  /// stored short segments).
  Metrics segment;
  /// Over clips (files), from the vote over each clip's tiles (loss NaN).
  Metrics file;
  /// What was scored: every clip, the frames covered (all of them), the view.
  Coverage coverage;
  /// Per-file decisions, on the CPU, in the split's file order.
  FileScores files;
  /// Wall time of the evaluation, seconds; and files per second.
  double seconds = 0;
  double files_per_s = 0;
  /// --task multilabel: true, and `multilabel` holds the metrics (`segment.loss` the mean BCE per tile; the
  /// other multi-class fields stay empty) and `file_scores` the per-file class probabilities, float32 CPU [F, C].
  bool is_multilabel = false;
  metrics::MultilabelMetrics multilabel;
  at::Tensor file_scores;
  /// --task verification: true, and `verification` holds the error rates of the scored trials, `det` their DET
  /// curve and `file_scores` the per-file embeddings, float32 CPU [F, E] (the multi-class fields stay empty).
  bool is_verification = false;
  verification::ErrorRates verification;
  std::vector<verification::DetPoint> det;

  /// {"tiles": ..., "file": ..., "coverage": Coverage::to_json(), "seconds", "files_per_s"}; multi-label:
  /// {"multilabel": ..., "coverage", "seconds", "files_per_s"}; verification: {"verification":
  /// ErrorRates::to_json(), "coverage", "seconds", "files_per_s"}.
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
};

/// Evaluates `model` (put in eval mode, no autograd; its mode is restored afterwards) on every clip of `split`
/// through the evaluation view of opts.view (plan_evaluation: tiles with min_real 0, each clip's last tile padded
/// and masked by its length), with the combined loss of models/model.h (`positive_class`, `bce_weight`) per tile and
/// the clip vote opts.vote over each clip's tiles. The tiles are gathered on the CPU (the next batch while the model
/// runs) and moved to `device`; `autocast` (at::kBFloat16 / at::kHalf, or at::kFloat for none) sets the forward's
/// precision. One host sync at the end. Throws FormatError when the split is empty, InvalidArgument when the tiles
/// are not the model's input width.
EvalResult evaluate(Classifier& model, const Split& split, int64_t positive_class, double bce_weight,
                    const EvalOptions& opts, at::Device device, at::ScalarType autocast = at::kFloat);

/// The first file (0-based row of its split) whose class probabilities or detection score in `result` are NaN or
/// infinite (its model output was not finite), or -1 when every file's are finite.
int64_t first_non_finite_file(const EvalResult& result);

}  // namespace melforge::trainer
