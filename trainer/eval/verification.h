#pragma once
/// Speaker-verification evaluation (`--task verification`): one embedding per clip (the embedding of the whole
/// utterance, pooled over its real frames; schema 1/2: the L2-normalised mean over its stored short segments), trials (a VoxCeleb-style list, or generated from the split's classes),
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
  /// A trial list in VoxCeleb's format (`1 a.wav b.wav` per line, paths as in the dataset's `path` column) for the
  /// evaluated split (`eval --split`, or the test split of `train`). Empty: trials generated from the split.
  std::filesystem::path trials;
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

  /// Throws InvalidArgument naming the flag.
  void validate() const;
  /// {"trials", "trial_count", "trial_seed", "as_norm", "cohort_size"}.
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults); FormatError on a mistyped one.
  static VerifyOptions from_json(const nlohmann::json& j);
};

/// Registers --trials --trial-count --trial-seed --as-norm --cohort-size.
void add_options(boost::program_options::options_description& desc, VerifyOptions& opts);

/// One embedding per clip of `split`: float32 CPU [files, E], row f the L2-normalised ModelOutput::embedding of
/// `model` (a speaker model; eval mode, no autograd, its mode restored) over the whole clip f: the clips view of a
/// schema-3 split (evaluation_view_options), clips batched by length under clip_batch_seconds of padded frames and
/// each pooled over its real frames; a schema-1/2 split's stored short segments (tiles, at most `batch_size` per
/// pass), their embeddings averaged per clip. `autocast` as evaluate(). A row whose output is not finite stays NaN (first_non_finite_row finds it). Throws InvalidArgument
/// when the model gives no embedding, FormatError when the split has no files.
/// `coverage`, when not null, receives what the embeddings cover (every clip, every frame).
at::Tensor embed_split(Classifier& model, const Split& split, int64_t batch_size, at::Device device,
                       at::ScalarType autocast = at::kFloat, Coverage* coverage = nullptr);

/// The first row of `embeddings` [N, E] holding a NaN or an infinity, or -1.
int64_t first_non_finite_row(const at::Tensor& embeddings);

/// The class of each file of `split` as int32 (the form the trial functions take), [files].
std::vector<int32_t> split_labels(const Split& split);

/// {target pairs, non-target pairs} of distinct files that `labels` (one class per file) allow.
std::pair<int64_t, int64_t> trial_pairs(const std::vector<int32_t>& labels);

/// The trials of `split` (whose rows `labels` and `paths` are): opts.trials read against `paths` when `use_list`
/// and a list is given, else opts.trial_count generated (clamped as VerifyOptions::trial_count says; `log`, when not
/// null, receives the line saying so). Throws FormatError naming the split when it cannot give a target and a
/// non-target trial, and what read_trials throws for a bad list.
std::vector<verification::Trial> split_trials(const std::vector<int32_t>& labels,
                                              const std::vector<std::string>& paths, const VerifyOptions& opts,
                                              bool use_list, const std::string& split_name,
                                              std::string* log = nullptr);

/// Scores `trials` on `embeddings` [F, E] (float32 CPU): cosine, or AS-norm against `cohort` [N, E] when opts.as_norm
/// > 0; then EER, minDCF and the DET curve, in EvalResult's verification fields (files_per_s over `files`).
EvalResult score_trials(const at::Tensor& embeddings, const std::vector<verification::Trial>& trials,
                        const VerifyOptions& opts, const at::Tensor& cohort);

/// The AS-norm cohort from the training split's embeddings [F, E]: every row, or opts.cohort_size rows evenly
/// spaced; an undefined tensor when opts.as_norm is 0.
at::Tensor cohort_rows(const at::Tensor& train_embeddings, const VerifyOptions& opts);

/// The verification part of a report: {"EER": percent, "minDCF_0.01", "minDCF_0.05", "eer_threshold", "targets",
/// "nontargets", "scoring": "cosine" or "as-norm", "as_norm_top_k", "trials": path or "generated"} plus
/// ErrorRates::to_json()'s fields.
nlohmann::json verification_json(const EvalResult& result, const VerifyOptions& opts);

}  // namespace melforge::trainer
