#pragma once
/// `melforge-train cv` (issue 30): cross-validation on a dataset with folds, with no rebuild. The three split files
/// are read once (frames in RAM when they fit in half of MemAvailable, streamed otherwise) and pooled; for each test
/// fold f (data/protocol/cv_splits.h: test = fold f, val = the next fold or a grouped share of the training folds,
/// train = the rest) the fold's splits are cut from the pool as row subsets (subset_split) and trained by train()
/// into DIR/fold-<f>/, a normal run folder. DIR/cv_splits.json records every fold's membership (the same as
/// melforge.cv_splits), DIR/cv_report.json the per-fold test metrics and their mean and standard deviation.
///
/// Resume: a fold whose run folder holds report.json (written by train() at the very end) is complete and skipped;
/// one with checkpoints/last.pt is resumed through train()'s --resume; any other is trained afresh. A stopped or
/// killed cv continues where it stopped when the same command runs again; a DIR whose cv_splits.json records other
/// membership (another dataset build, --val or --seed) is refused unless --overwrite, which trains every fold again.
#include <boost/program_options/options_description.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "protocol/cv_splits.h"
#include "train/trainer.h"

namespace melforge::trainer {

/// The flags of `cv` besides those of `train`.
struct CvCommandOptions {
  /// --folds: the test folds to run, e.g. "1,2,3"; empty: every fold that holds files.
  std::string folds;
  /// --val: fold-offset (the next fold, wrapping K -> 1), ratio (a grouped, stratified share of 0.1 of the training
  /// folds) or ratio:R.
  std::string val = "fold-offset";

  /// The protocol's options: --folds and --val parsed, `seed` (the run's --seed) for the ratio draw. Throws
  /// InvalidArgument naming the flag.
  data::CvOptions parse(uint64_t seed) const;
};

/// Registers --folds and --val.
void add_options(boost::program_options::options_description& desc, CvCommandOptions& opts);

/// One test fold's outcome.
struct CvFoldResult {
  /// The test fold, and the val fold (0 with --val ratio).
  int64_t fold = 0, val_fold = 0;
  /// Files of the fold's train, val and test splits.
  int64_t train_files = 0, val_files = 0, test_files = 0;
  /// The test metrics of the fold's best.pt, from its report.json: file_accuracy and file_macro_f1 (single-label),
  /// map (multilabel: macro mAP). NaN when the report holds null.
  std::map<std::string, double> metrics;
  /// DIR/fold-<f>.
  std::filesystem::path run_dir;
  /// The fold was complete already (skipped), or its run was resumed.
  bool skipped = false, resumed = false;
};

/// What `cv` did.
struct CvResult {
  /// A hook stopped a fold's run (TrainHooks::on_epoch_end): no report; run cv again to continue.
  bool interrupted = false;
  /// The folds run or skipped, in fold order.
  std::vector<CvFoldResult> folds;
  /// The protocol's metric: "file_accuracy" or "map"; and each metric's mean and sample standard deviation over
  /// the folds (n - 1 in the denominator; 0 for one fold).
  std::string metric;
  std::map<std::string, double> mean, std;
  /// DIR/cv_report.json.
  std::filesystem::path report;
};

/// Runs `cv` as the header says: `config` is the train command's configuration (--data DS, --out DIR and the training
/// flags, applied to every fold), `hooks` are passed to every fold's train() (TrainHooks::dataset is set by cv).
/// Everything is checked before any work: InvalidArgument for --resume (cv resumes by itself), --task verification,
/// a bad --folds or --val, or a fold that --folds names and the dataset lacks; FormatError for a dataset without
/// folds (naming `melforge-build --folds K` and `--layout`). Logs on `log`.
CvResult run_cv(TrainConfig config, const CvCommandOptions& options, std::ostream& log, const TrainHooks& hooks = {});

/// The one line `cv` prints: "cv: mean file accuracy 0.912 ± 0.031 over 5 folds" (mAP for multilabel).
std::string cv_summary_line(const CvResult& result);

}  // namespace melforge::trainer
