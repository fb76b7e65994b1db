#pragma once
/// Classification metrics, accumulated on the device without host syncs, and the clip-level (file) vote over a
/// clip's examples. The math is plain and tested on hand-computed cases (tests/test_trainer_metrics.cpp); the metrics
/// from counts and the CPU vote are kernels/metrics and kernels/vote.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metrics/metrics.h"
#include "vote/vote.h"

namespace melforge::trainer {

/// The metrics types live in kernels/metrics (torch-free, shared with the Python package).
using metrics::ClassScores;
using metrics::Metrics;

/// Metrics from counts: `confusion` int64 [C, C] (true, predicted) and `det_confusion` int64 [2, 2], on any
/// device; `loss_sum` is the summed loss over `confusion.sum()` examples (NaN: unknown).
Metrics metrics_from_counts(const at::Tensor& confusion, const at::Tensor& det_confusion, double loss_sum);

/// Accumulates counts on the device of its tensors; only finish() syncs with the host.
class MetricAccumulator {
 public:
  /// `positive_class` in [0, num_classes), or -1 for no detection head (Metrics::has_detection false); `threshold`:
  /// detection probability at or above which a segment is called positive.
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

/// The clip-level vote (kernels/vote/vote.h): mean or majority, parse_vote and to_string.
using vote::parse_vote;
using vote::to_string;
using vote::Vote;

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

/// Per-clip decisions from example outputs, on the device of `probs` with no host sync: vote::vote_clips's semantics
/// (tested against it in test_trainer_metrics). `probs`: softmax probabilities [E, C]; `det_probs`: sigmoid of the
/// detection logits [E], or undefined (no detection head: detection_score 0, detected false); `clip`: int64 [E],
/// each example's clip in [0, clips). The caller guarantees every clip has an example (evaluate plans them so; a clip
/// without one would give NaN).
FileScores vote_clips(const at::Tensor& probs, const at::Tensor& det_probs, const at::Tensor& clip, int64_t clips,
                      Vote vote, double threshold);

/// Examples per clip, float64 [clips] on the device of `clip` (int64 [E]).
at::Tensor clip_counts(const at::Tensor& clip, int64_t clips);

/// The mean over each clip's rows: `values` [E, K] (any float type), `clip` int64 [E] -> float64 [clips, K], divided
/// by `counts` (clip_counts).
at::Tensor clip_means(const at::Tensor& values, const at::Tensor& clip, const at::Tensor& counts);

}  // namespace melforge::trainer
