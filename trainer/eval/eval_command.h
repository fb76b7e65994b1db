#pragma once
/// `melforge-train eval`: a checkpoint evaluated on one split of a dataset, printed as a summary and written as a
/// JSON report.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>

#include "eval/evaluate.h"
#include "eval/verification.h"
#include "options.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// `eval` settings besides the data, evaluation and runtime groups.
struct EvalCommandOptions {
  /// The checkpoint to evaluate.
  std::filesystem::path checkpoint;
  /// Where to write the JSON report (empty: nowhere; the summary is printed either way).
  std::filesystem::path out;
  /// A verification checkpoint: trials and scoring (--trials, --trial-count, --trial-seed, --as-norm, --cohort-size;
  /// the AS-norm cohort is the dataset's training split).
  VerifyOptions verify;
  /// A verification checkpoint: the DET curve's PNG is written here (empty: none); with several lists, the first
  /// list's curve.
  std::filesystem::path det_png;
  /// A verification checkpoint: the trial scores (`score label enroll test` per line, verification::scores_text) are
  /// written here: the file itself for generated trials or one list, else a folder (created when its parent exists)
  /// receiving `<list file name>.scores` per list. Empty: none.
  std::filesystem::path scores;

  /// Throws InvalidArgument when the checkpoint is missing or the verification options are out of range.
  void validate() const;
};

/// Registers --checkpoint --out --det-png --scores and the verification options.
void add_options(boost::program_options::options_description& desc, EvalCommandOptions& opts);

/// `eval`: loads the checkpoint and the dataset, checks they fit, evaluates split eval.split and prints a summary
/// on `out` (and the JSON report to opts.out). Returns the report: {"checkpoint", "data", "split", "classes",
/// "positive_class", "segment", "file", "seconds", "files_per_s"}. A verification checkpoint (whose class set need
/// not be the dataset's; its mel parameters must be) is scored on the split's trials instead: the summary line
/// reads `EER <percent> %` (one line per trial list) and the report holds {"task": "verification", "EER" (percent),
/// "minDCF_0.01", "minDCF_0.05", "verification": {...}} of the first list (or the generated trials), "lists": {list
/// path as given: verification_json} of every list, "trial_lists": [paths in the order given], "scores": [files
/// written], and "forward_passes" (the model's forward passes over the split: one embedding of it, however many
/// lists).
nlohmann::json run_eval(const EvalCommandOptions& opts, const DataOptions& data, const EvalOptions& eval,
                        const RuntimeOptions& runtime, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
