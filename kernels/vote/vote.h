#pragma once
/// The file-level vote of `melforge-train eval` and `predict`: per-file (per-clip) decisions from the class and
/// detection probabilities of a clip's examples (vote_clips: the tiles of a view, any number per clip), or of a
/// schema-1/2 file's segments in the dense [F, L, S, C] layout (aggregate_files). Plain C++ (no LibTorch), so the trainer's predict, its tests and the Python
/// package (melforge.evaluate_files, melforge.predict) all run this one function.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace melforge::vote {

/// How a clip's units (its examples for vote_clips, its valid long segments for aggregate_files) are combined.
enum class Vote {
  /// Mean of the units' probabilities.
  mean,
  /// Each unit votes for its argmax class; the most votes wins, ties broken by the mean probability. The detection
  /// head: positive when more than half of the units are at or above the threshold; its score is that fraction.
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

/// Per-clip decisions from the outputs of E examples of F clips (any number of examples per clip, in any order):
/// `probs` softmax probabilities [E, C], `det_probs` sigmoid detection probabilities [E] (empty: no detection head,
/// then detection_score is 0 and detected 0 for every clip), `clip` [E] the clip of each example, in [0, clips).
/// Each example is one unit of `vote` (the semantics of aggregate_files with one short segment per unit): mean, or
/// majority with ties broken by the mean probability and then the first class; double accumulation, float32
/// results. Every clip must have at least one example (a clip without one would go unscored): InvalidArgument
/// naming the first such clip, as for a size that does not match, a clip index outside [0, clips), num_classes < 1
/// or a threshold that is not finite.
FileVotes vote_clips(std::span<const float> probs, std::span<const float> det_probs, std::span<const int64_t> clip,
                     int64_t clips, int64_t num_classes, Vote vote, double threshold);

/// How a multi-label clip's tiles are combined into its class scores (`--aggregate`, `--task multilabel`).
enum class Aggregate {
  /// Mean of the tiles' sigmoid probabilities, per class.
  mean,
  /// Maximum of the tiles' sigmoid probabilities, per class.
  max,
};
/// "mean" or "max".
std::string to_string(Aggregate a);
/// Parses "mean" or "max"; throws InvalidArgument ("--aggregate: 'x' is not one of mean, max") otherwise.
Aggregate parse_aggregate(const std::string& s);

/// Per-clip multi-label scores and label sets, row-major.
struct ClipLabels {
  /// Class scores, float32 [clips, C]: the mean or max of the examples' probabilities (double accumulation).
  std::vector<float> scores;
  /// Label decisions, [clips, C] (0 or 1): score >= threshold (compared in double, as the multi-label metrics compare).
  std::vector<uint8_t> labels;
};

/// Per-clip multi-label decisions from the sigmoid probabilities `probs` [E, C] of E examples and `clip` [E] (the
/// clip of each example, in [0, clips), any order): each class's score is the mean or the max (`how`) over the
/// clip's examples, and a clip carries a label when its score is >= `threshold`. What `melforge-train predict` and
/// melforge.predict run for a --task multilabel checkpoint (eval's aggregate_multilabel_clips on the host). Throws
/// InvalidArgument as vote_clips does (sizes, a clip index out of range, a clip without an example, a threshold
/// that is not finite).
ClipLabels multilabel_clips(std::span<const float> probs, std::span<const int64_t> clip, int64_t clips,
                            int64_t num_classes, Aggregate how, double threshold);

}  // namespace melforge::vote
