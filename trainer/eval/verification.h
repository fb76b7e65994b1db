#pragma once
/// Speaker-verification evaluation (`--task verification`): one embedding per clip (the embedding of the whole
/// utterance, pooled over its real frames, or the mean of evenly spaced crops; schema 1/2: the L2-normalised mean
/// over its stored short segments), trials (VoxCeleb-style lists, or generated from the split's classes),
/// cosine or AS-norm scores, EER and minDCF (kernels/verification), and the DET curve.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/evaluate.h"
#include "verification/verification.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

class Classifier;
struct Split;

/// `--task verification`: speaker models (`resnet-se`, `ecapa`) trained with the AAM-softmax loss, evaluated by EER.
inline constexpr const char* kTaskVerification = "verification";

/// How a verification model is scored, shared by `train` (validation and the final evaluation) and `eval`.
struct VerifyOptions {
  /// Trial lists in VoxCeleb's format (`1 a.wav b.wav` per line; `--trials` repeatable) for the evaluated split
  /// (`eval --split`, or the test split of `train`), all scored on one set of embeddings; paths resolved against the
  /// split's stored paths by verification::TrialPathIndex (exactly, under --trials-root, absolute, or as the end of a
  /// stored path). Empty: trials generated from the split.
  std::vector<std::filesystem::path> trials;
  /// `--trials-root`: the folder the lists' paths are relative to (verification::TrialPathRules::root): relative,
  /// to the folder the dataset's stored paths are relative to (a prefix such as `wav`); absolute, anywhere.
  std::string trials_root;
  /// Trials generated from a split without --trials (half target, half non-target; even, >= 2). When the split has
  /// fewer pairs of either kind, as many as it has of the rarer kind, twice (said in the log).
  int64_t trial_count = 10000;
  /// Seed of the generated trials (the same split and seed give the same trials).
  uint64_t trial_seed = 1;
  /// AS-norm (adaptive symmetric score normalisation) with the top K cohort scores; 0: plain cosine scores. The
  /// cohort is the training split's file embeddings.
  int64_t as_norm = 0;
  /// At most this many training files (evenly spaced in the split's order) form the AS-norm cohort; 0: all of them.
  int64_t cohort_size = 0;
  /// `--embed-crops N`: a clip's embedding is the mean of the embeddings of N evenly spaced crops of the run's
  /// --crop-seconds (crop_starts), L2-normalised; 0: the whole utterance. At most kMaxEmbedCrops.
  int64_t embed_crops = 0;

  /// Throws InvalidArgument naming the flag (a list given twice among them).
  void validate() const;
  /// {"trials": [absolute paths], "trials_root", "trial_count", "trial_seed", "as_norm", "cohort_size",
  /// "embed_crops"}.
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults; "trials" as a string, an older configuration's one
  /// list or "" for none, or an array of strings); FormatError on a mistyped one.
  static VerifyOptions from_json(const nlohmann::json& j);
};

/// Largest --embed-crops.
inline constexpr int64_t kMaxEmbedCrops = 1000;

/// Registers --trials (repeatable) --trials-root --trial-count --trial-seed --as-norm --cohort-size --embed-crops.
void add_options(boost::program_options::options_description& desc, VerifyOptions& opts);

/// How embed_split embeds a clip: whole, or as the mean of evenly spaced crops (VerifyOptions::embed_crops).
struct EmbedCrops {
  /// Crops per clip; 0: the whole clip.
  int64_t count = 0;
  /// Crop length, seconds (the run's --crop-seconds; > 0 when count > 0).
  double seconds = 2.0;
};

/// One embedding per clip of `split`: float32 CPU [files, E], row f the L2-normalised ModelOutput::embedding of
/// `model` (a speaker model; eval mode, no autograd, its mode restored) over the whole clip f: the clips view of a
/// schema-3 split (evaluation_view_options), clips batched by length under clip_batch_seconds of padded frames and
/// each pooled over its real frames; a schema-1/2 split's stored short segments (tiles, at most `batch_size` per
/// pass), their embeddings averaged per clip. With crops.count > 0 (schema 3 only) the mean of the embeddings of
/// the clip's crops (plan_crops), then L2-normalised. `autocast` as evaluate(). A row whose output is not finite
/// stays NaN (first_non_finite_row finds it). Throws InvalidArgument when the model gives no embedding or crops of
/// a schema-1/2 split are asked for, FormatError when the split has no files. `coverage`, when not null, receives
/// what the embeddings cover (every clip, every frame with whole clips) and the forward passes run.
at::Tensor embed_split(Classifier& model, const Split& split, int64_t batch_size, at::Device device,
                       at::ScalarType autocast = at::kFloat, Coverage* coverage = nullptr,
                       const EmbedCrops& crops = {});

/// The first row of `embeddings` [N, E] holding a NaN or an infinity, or -1.
int64_t first_non_finite_row(const at::Tensor& embeddings);

/// The class of each file of `split` as int32 (the form the trial functions take), [files].
std::vector<int32_t> split_labels(const Split& split);

/// {target pairs, non-target pairs} of distinct files that `labels` (one class per file) allow.
std::pair<int64_t, int64_t> trial_pairs(const std::vector<int32_t>& labels);

/// The trials of a split and what names them: a list as read (its path and fields as written), or generated.
struct SplitTrials {
  /// The list's path as given (--trials), or empty for generated trials.
  std::filesystem::path list;
  /// The trials, indices into the split's rows.
  std::vector<verification::Trial> trials;
  /// The enrolment and test fields of each trial as written in the list; for generated trials the stored paths.
  std::vector<std::string> enroll, test;
};

/// The trial sets of `split` (whose rows `labels` and `paths` are): each of opts.trials read against `paths` (one
/// verification::TrialPathIndex for all, opts.trials_root) when `use_list` and lists are given, else one set of
/// opts.trial_count generated trials (clamped as VerifyOptions::trial_count says; `log`, when not null, receives
/// the line saying so). Throws FormatError naming the split when it cannot give a target and a non-target trial,
/// and what read_trial_list throws for a bad list.
std::vector<SplitTrials> split_trial_sets(const std::vector<int32_t>& labels, const std::vector<std::string>& paths,
                                          const VerifyOptions& opts, bool use_list, const std::string& split_name,
                                          std::string* log = nullptr);

/// The trials of split_trial_sets' first set.
std::vector<verification::Trial> split_trials(const std::vector<int32_t>& labels,
                                              const std::vector<std::string>& paths, const VerifyOptions& opts,
                                              bool use_list, const std::string& split_name,
                                              std::string* log = nullptr);

/// Scores `trials` on `embeddings` [F, E] (float32 CPU): cosine, or AS-norm against `cohort` [N, E] when opts.as_norm
/// > 0; then EER, minDCF and the DET curve, in EvalResult's verification fields (files_per_s over `files`).
/// `scores`, when not null, receives the trial scores [trials].
EvalResult score_trials(const at::Tensor& embeddings, const std::vector<verification::Trial>& trials,
                        const VerifyOptions& opts, const at::Tensor& cohort, std::vector<float>* scores = nullptr);

/// The AS-norm cohort from the training split's embeddings [F, E]: every row, or opts.cohort_size rows evenly
/// spaced; an undefined tensor when opts.as_norm is 0.
at::Tensor cohort_rows(const at::Tensor& train_embeddings, const VerifyOptions& opts);

/// The verification part of a report: {"EER": percent, "minDCF_0.01", "minDCF_0.05", "eer_threshold", "targets",
/// "nontargets", "scoring": "cosine" or "as-norm", "as_norm_top_k", "trials": `list` or "generated" when empty} plus
/// ErrorRates::to_json()'s fields.
nlohmann::json verification_json(const EvalResult& result, const VerifyOptions& opts,
                                 const std::filesystem::path& list);

/// The text of a scores file: one line per trial, `score label enroll test` (score %.6f, label 1 or 0, enroll and
/// test as `set` names them), `scores` [trials].
std::string scores_text(const SplitTrials& set, const std::vector<float>& scores);

/// Where the scores of each of `sets` go when scores are asked for at `where`: `where` itself for one set, else
/// `where/<list file name>.scores` per list (`where` a folder). Throws InvalidArgument naming `flag` when two lists
/// share a file name (their scores files would collide).
std::vector<std::filesystem::path> scores_paths(const std::filesystem::path& where,
                                                const std::vector<SplitTrials>& sets, const std::string& flag);

/// The scores-file paths of `lists` (scores_paths without the trials): checks, before any work, that the files can be
/// written: for one list (or none: generated trials) `where` is a file whose parent folder exists, for several a
/// folder that exists or whose parent does; throws InvalidArgument naming `flag` otherwise, or when two lists share a
/// file name.
void check_scores_path(const std::filesystem::path& where, const std::vector<std::filesystem::path>& lists,
                       const std::string& flag);

}  // namespace melforge::trainer
