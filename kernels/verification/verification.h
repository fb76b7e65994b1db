#pragma once
/// Speaker-verification scoring without LibTorch: trial lists (generated or read in VoxCeleb's format), cosine and
/// AS-norm scores of per-file embeddings, EER and minDCF, the DET curve and its PNG. `melforge-train` evaluates
/// `--task verification` with these.
///
/// Conventions (checked against scikit-learn by tests/test_verification.cpp on fixtures that
/// tools/gen_verification_fixtures.py writes):
/// - A trial is accepted (called a target) when its score is >= the threshold. The DET curve has one point per
///   distinct score, taken in descending order (tied scores form one point, as sklearn.metrics.roc_curve with
///   drop_intermediate=False), after a first point at threshold +inf (everything rejected: p_fa 0, p_miss 1). The
///   last point (lowest score) accepts everything: p_fa 1, p_miss 0.
/// - p_fa (false-alarm rate) = accepted non-targets / non-targets (sklearn's fpr); p_miss (miss rate) = rejected
///   targets / targets (1 - sklearn's tpr).
/// - EER is a fraction in [0, 1] (callers print percent). It is the point where p_miss and p_fa cross on the DET
///   curve drawn with straight segments between consecutive points: at the first point k (descending thresholds)
///   with p_fa >= p_miss, d_k = p_miss - p_fa; when d_k = 0, EER = p_fa of k, otherwise the segment from k - 1
///   (d_{k-1} > 0) to k is interpolated linearly, t = d_{k-1} / (d_{k-1} - d_k), EER = p_fa_{k-1} + t (p_fa_k -
///   p_fa_{k-1}) (= the same interpolation of p_miss). eer_threshold is the threshold of point k: the highest
///   distinct score at which the false-alarm rate reaches the miss rate.
/// - minDCF at p_target p (C_miss = C_fa = 1 unless given) is min over the DET points of C_miss p p_miss + C_fa (1 -
///   p) p_fa, divided by min(C_miss p, C_fa (1 - p)), as the VoxCeleb and NIST SRE reference scripts do. It is
///   therefore at most 1 (the "reject everything" or "accept everything" system).
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "melforge/common/png.h"

namespace melforge::verification {

/// One verification trial: two files (indices into the caller's list of files or rows of embeddings) and whether
/// they come from the same class (speaker).
struct Trial {
  /// Index of the enrolment file, in [0, files).
  int64_t enroll = 0;
  /// Index of the test file, in [0, files).
  int64_t test = 0;
  /// True when both files have the same class (a target trial), false otherwise (a non-target trial).
  bool target = false;

  bool operator==(const Trial&) const = default;
};

/// `count` trials drawn from files with class `labels` [files], half of them target (count / 2 pairs of distinct
/// files of the same class) and half non-target (count / 2 pairs of files of different classes). Pairs are
/// unordered and never repeated: every trial has enroll < test, and the list is sorted by (enroll, test). The draw
/// is a function of (labels, count, seed) only (SplitMix64 from `seed`): the same arguments give the same list on
/// every platform. Throws InvalidArgument, before drawing, when count is not even and positive, when the labels have
/// fewer than 2 classes, when no class has 2 files, or when count / 2 exceeds the target or the non-target pairs
/// available (the message gives both numbers).
std::vector<Trial> generate_trials(const std::vector<int32_t>& labels, int64_t count, uint64_t seed);

/// Largest trial list read_trial_list reads: 256 MiB (VoxCeleb1-H, 550,000 trials, is 44 MB).
inline constexpr std::uintmax_t kMaxTrialListBytes = std::uintmax_t{256} << 20;
/// Longest line of a trial list, bytes (three fields of at most 4,096 bytes each, as PATH_MAX, and separators).
inline constexpr std::size_t kMaxTrialLineBytes = 3 * 4096 + 64;

/// How a trial list's path fields name the split's stored paths beyond an exact match.
struct TrialPathRules {
  /// `--trials-root`: the folder the list's paths are written relative to. A relative one is relative to the folder
  /// the stored paths are relative to (the split files do not record where the corpus lay when it was built), i.e.
  /// a prefix such as `wav` for a dataset storing `wav/id10270/...` and a list writing `id10270/...`; an absolute one
  /// makes every joined path absolute (then matched as an absolute field). Empty: none.
  std::string root;
};

/// The stored paths of a split (its `path` strings, position = file index), indexed once for matching trial-list
/// fields: exactly, and by their trailing path components. Torch-free, for the trainer and a Python binding.
class TrialPathIndex {
 public:
  /// Indexes `stored` [files]. Throws InvalidArgument naming the path when a path is there twice.
  explicit TrialPathIndex(std::vector<std::string> stored);

  /// Outcome of find(): a file index, or none with the candidates of an ambiguous field.
  struct Match {
    /// Index into the stored paths, or -1 (unknown or ambiguous).
    int64_t index = -1;
    /// Stored paths ending in "/<field>" when several do (at most 3, in index order; `ambiguous` counts them all).
    std::vector<std::string> candidates;
    /// How many stored paths end in "/<field>" (> 1: ambiguous).
    int64_t ambiguous = 0;
  };

  /// The stored path that `field` names, tried in this order: (1) equal to it; (2) with a rules.root, equal to
  /// root/field lexically normalised (an absolute root: rule 3 applied to root/field); (3) an absolute field: the
  /// stored path equal to its longest trailing run of components (the absolute path made relative to the folder the
  /// stored paths are relative to, wherever the corpus lies on this machine); (4) a relative field: the only stored
  /// path ending in "/<field>" (lexically normalised), e.g. `wav/id10270/5r0dWxy17C8/00001.wav` for
  /// `id10270/5r0dWxy17C8/00001.wav`. Several stored paths ending so: ambiguous (index -1, candidates filled).
  Match find(std::string_view field, const TrialPathRules& rules = {}) const;

  /// Stored paths indexed.
  int64_t files() const { return static_cast<int64_t>(stored_.size()); }
  /// Stored path `i`.
  const std::string& path(int64_t i) const { return stored_[static_cast<std::size_t>(i)]; }

 private:
  int64_t exact(const std::string& p) const;
  int64_t longest_tail(const std::string& absolute) const;
  std::vector<std::string> stored_;
  std::unordered_map<std::string, int64_t> exact_;
  /// Each proper trailing run of components ("b/c.wav", "c.wav" of "a/b/c.wav") -> the stored paths ending so
  /// (at most 3 kept) and their count.
  std::unordered_map<std::string, std::pair<int64_t, std::vector<int64_t>>> tails_;
};

/// A trial list as read: its trials and each trial's two path fields exactly as written.
struct TrialList {
  /// The list's file.
  std::filesystem::path path;
  /// One per trial line, in file order; indices into the TrialPathIndex's stored paths.
  std::vector<Trial> trials;
  /// The enrolment and test fields of each trial, as written in the list, [trials].
  std::vector<std::string> enroll, test;
};

/// The trials of a VoxCeleb-style trial list at `path`: one trial per line, `LABEL ENROLL TEST` separated by spaces
/// or tabs, LABEL 1 (target) or 0 (non-target), ENROLL and TEST resolved by index.find(field, rules). Blank lines
/// are skipped; a trailing '\r' is ignored. The file is untrusted: it must be a regular file of at most `max_bytes`
/// (InvalidArgument otherwise, FormatError when larger; read_regular_file), each line at most kMaxTrialLineBytes.
/// Throws IoError when it cannot be read, FormatError naming `<list>:<line>` and the problem: a line too long, a
/// field count other than 3, a label other than 0 or 1, an unknown path (every unknown path of the line is named),
/// an ambiguous path (named with up to 3 of the stored paths it could be), or a list without any trial.
TrialList read_trial_list(const std::filesystem::path& path, const TrialPathIndex& index,
                          const TrialPathRules& rules = {}, std::uintmax_t max_bytes = kMaxTrialListBytes);

/// read_trial_list(path, TrialPathIndex(file_paths)).trials: the list's paths resolved against `file_paths` (the
/// dataset's `path` strings; the trial's indices are positions in it). Throws as TrialPathIndex and read_trial_list.
std::vector<Trial> read_trials(const std::filesystem::path& path, const std::vector<std::string>& file_paths);

/// The `target` flags of `trials` as 1 / 0, the form error_rates and det_curve take.
std::vector<uint8_t> trial_targets(const std::vector<Trial>& trials);

/// Cosine similarity of each trial's two rows of `embeddings`, row-major [rows, dim] float32: dot(e, t) / (|e| |t|),
/// computed in double, one score per trial in [-1, 1]. Throws InvalidArgument when rows or dim is not positive, when
/// a trial's index is outside [0, rows) (naming the trial), or when a row used by a trial has zero or non-finite
/// norm (naming the row).
std::vector<float> cosine_scores(const float* embeddings, int64_t rows, int64_t dim, const std::vector<Trial>& trials);

/// Adaptive symmetric score normalisation (AS-norm, as in the public VoxCeleb recipes, e.g. WeSpeaker's
/// score_norm.py). For each trial with cosine score s between rows e and t of `embeddings` [rows, dim], the cosine
/// scores of e against every row of `cohort` [cohort_rows, dim] are taken, their top_k largest give mean mu_e and
/// standard deviation sd_e (population, divided by top_k), likewise mu_t, sd_t for t; the result is
/// 0.5 ((s - mu_e) / sd_e + (s - mu_t) / sd_t). top_k larger than cohort_rows uses every cohort row. Statistics are
/// computed once per distinct row used by the trials, on `threads` threads (0: one per core). Throws
/// InvalidArgument when top_k < 2, when cohort_rows < 2, for the cases of cosine_scores (for a zero cohort row too,
/// naming it), and when a row's top-k cohort scores are all equal (sd 0, naming the row).
std::vector<float> as_norm(const float* embeddings, int64_t rows, int64_t dim, const std::vector<Trial>& trials,
                           const float* cohort, int64_t cohort_rows, int64_t top_k, int threads = 0);

/// One point of a DET curve.
struct DetPoint {
  /// The threshold: trials with score >= it are accepted; +inf for the first point (nothing accepted).
  double threshold = 0;
  /// False-alarm rate: accepted non-targets / non-targets, in [0, 1].
  double p_fa = 0;
  /// Miss rate: rejected targets / targets, in [0, 1].
  double p_miss = 0;
};

/// The DET curve of `scores` [trials] against `targets` [trials] (1 target, 0 non-target): the +inf point, then one
/// point per distinct score in descending order (see the file comment). Throws InvalidArgument when the sizes
/// differ, when there is no target or no non-target trial, or when a score is NaN (naming its index).
std::vector<DetPoint> det_curve(const std::vector<float>& scores, const std::vector<uint8_t>& targets);

/// Normalised minimum detection cost over the points of `det` at prior `p_target` in (0, 1), with costs c_miss and
/// c_fa > 0 (see the file comment). `threshold`, when given, receives the threshold of the first point reaching
/// the minimum. Throws InvalidArgument on an empty curve or parameters out of range.
double min_dcf(const std::vector<DetPoint>& det, double p_target, double c_miss = 1, double c_fa = 1,
               double* threshold = nullptr);

/// The equal error rate of `det` as a fraction (see the file comment); `threshold`, when given, receives
/// eer_threshold. Throws InvalidArgument on an empty curve or one that does not start at p_miss 1 > p_fa.
double equal_error_rate(const std::vector<DetPoint>& det, double* threshold = nullptr);

/// Verification metrics of one list of scored trials.
struct ErrorRates {
  /// Equal error rate, a fraction in [0, 1] (not percent).
  double eer = 0;
  /// Threshold of the DET point where p_fa first reaches p_miss (score units).
  double eer_threshold = 0;
  /// Normalised minDCF at p_target 0.01 and 0.05, C_miss = C_fa = 1.
  double min_dcf_01 = 0;
  double min_dcf_05 = 0;
  /// Thresholds where those minima are first reached (+inf when rejecting everything is best).
  double min_dcf_01_threshold = 0;
  double min_dcf_05_threshold = 0;
  /// Target and non-target trials scored.
  int64_t targets = 0;
  int64_t nontargets = 0;

  /// {"eer", "eer_percent", "eer_threshold", "min_dcf_0.01", "min_dcf_0.05", "min_dcf_0.01_threshold",
  /// "min_dcf_0.05_threshold", "targets", "nontargets"}; a non-finite threshold is written as null.
  nlohmann::json to_json() const;
};

/// EER and minDCF (0.01, 0.05) of `scores` against `targets`, from det_curve; throws as det_curve does.
ErrorRates error_rates(const std::vector<float>& scores, const std::vector<uint8_t>& targets);

/// Side of the square DET picture in pixels.
inline constexpr int64_t kDetImageSize = 400;

/// Probability range of both DET axes (0.1 % to 80 %), on the probit (normal deviate) scale.
inline constexpr double kDetAxisMin = 0.001, kDetAxisMax = 0.8;

/// The normal deviate (probit) of probability p in (0, 1): the x with Phi(x) = p (Acklam's rational approximation
/// refined by one Halley step, error below 1e-12). Throws InvalidArgument outside (0, 1).
double probit(double p);

/// The DET curve `det` drawn into a kDetImageSize x kDetImageSize RGB picture: p_fa on x (left to right), p_miss on
/// y (bottom to top), both on probit scales over [kDetAxisMin, kDetAxisMax] (values outside are clamped to the
/// frame); white background, light grey grid lines at 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 40 %, a grey diagonal
/// (p_fa = p_miss), a black frame, the curve in blue and a red square at (eer, eer). No text.
RgbImage det_image(const std::vector<DetPoint>& det, double eer);

/// Writes det_image(det, eer) as a PNG file at `path` (atomically). Throws IoError naming the path on failure.
void write_det_png(const std::filesystem::path& path, const std::vector<DetPoint>& det, double eer);

}  // namespace melforge::verification
