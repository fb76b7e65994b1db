#pragma once
/// The file-level vote of `melforge-train eval` and `predict`: per-file decisions from the class and detection
/// probabilities of a file's segments. Plain C++ (no LibTorch), so the trainer's predict, its tests and the Python
/// package (melforge.evaluate_files, melforge.predict) all run this one function.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace melforge::vote {

/// How a file's long segments are combined.
enum class Vote {
  /// Mean of the long-segment probabilities over the valid long segments.
  mean,
  /// Each valid long segment votes for its argmax class; the most votes wins, ties broken by the mean
  /// probability. The detection head: positive when more than half of the valid long segments are at or above
  /// the threshold; its score is that fraction.
  majority,
};
/// "mean" or "majority".
std::string to_string(Vote v);
/// Parses "mean" or "majority"; throws InvalidArgument ("--vote: 'x' is not one of mean, majority") otherwise.
Vote parse_vote(const std::string& s);

/// Geometry of the segment outputs of F files.
struct VoteShape {
  /// Files (F), long segments per file (L), short segments per long segment (S), classes (C); all >= 1 except F
  /// (>= 0).
  int64_t files = 0;
  int64_t num_long = 0;
  int64_t num_short = 0;
  int64_t num_classes = 0;
};

/// Per-file decisions, row-major.
struct FileVotes {
  /// Class probabilities, float32 [F, C] (mean vote: the mean; majority: vote fractions).
  std::vector<float> class_probs;
  /// Predicted class per file, [F].
  std::vector<int64_t> predicted;
  /// Detection score per file, float32 [F] (mean: mean probability; majority: fraction of positive votes).
  std::vector<float> detection_score;
  /// Detection decision per file, [F] (0 or 1).
  std::vector<uint8_t> detected;
};

/// File-level decisions from segment outputs. `probs`: softmax probabilities [F, L, S, C]; `det_probs`: sigmoid
/// of the detection logits [F, L, S]; `num_valid_long`: [F], each in [1, L] (long segments >= it are ignored);
/// all row-major. Per long segment the short-segment probabilities are averaged first (in double), then `vote`
/// combines the valid long segments (double accumulation, float32 results). Ties: the argmax is the first
/// maximal class; majority compares (votes, mean probability) and then takes the first class. Mean detection:
/// detected when the score (in double) is >= `threshold`; majority: when the fraction of long segments whose mean
/// detection probability is >= `threshold` is > 0.5. Throws InvalidArgument when a size does not match `shape`,
/// a num_valid_long is outside [1, L] or `threshold` is not finite.
FileVotes aggregate_files(std::span<const float> probs, std::span<const float> det_probs,
                          std::span<const int64_t> num_valid_long, const VoteShape& shape, Vote vote,
                          double threshold);

}  // namespace melforge::vote
