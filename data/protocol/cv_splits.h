#pragma once
/// Cross-validation membership of a dataset with folds (issue 30): the three split files' clips pooled and
/// re-partitioned by fold, whatever split each file was stored in. For each test fold f: test = the files of fold f;
/// val = the next fold that holds files (fold-offset, wrapping K -> 1) or a grouped share of the training folds
/// (ratio R: whole groups, stratified by class, seeded); train = the rest. Torch-free: melforge-train cv and
/// melforge.cv_splits compute the same membership through these functions.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reader/split_info.h"

namespace melforge::data {

/// Every file of a dataset's three splits, in split order (train, val, test) and row order within each.
struct FoldPool {
  /// The dataset folder (for messages).
  std::filesystem::path dir;
  /// The number of folds K (the splits' root attribute `folds`, equal in the three).
  int64_t num_folds = 0;
  /// The build_id the splits carry ("" when they carry none).
  std::string build_id;
  /// Per pooled file: index of its split in kSplitNames (0 train, 1 val, 2 test), [P].
  std::vector<int> split;
  /// Per pooled file: its row in that split, [P].
  std::vector<int64_t> row;
  /// Per pooled file: its fold, in [1, num_folds], [P].
  std::vector<int32_t> fold;
  /// Per pooled file: its class (the split's `label`), [P].
  std::vector<int64_t> label;
  /// Per pooled file: its group ("" none: the file is a group of its own), [P].
  std::vector<std::string> group;

  /// Number of pooled files (P).
  int64_t size() const { return static_cast<int64_t>(row.size()); }
  /// Files of each fold, [num_folds + 1] (index 0 unused).
  std::vector<int64_t> fold_counts() const;
};

/// Pools `splits` (train, val and test of one dataset, in that order, as read by read_split_info). Throws FormatError
/// naming the folder when a split has no folds (with the way to give them: `melforge-build --folds K`, a manifest's
/// fold column, or a `--layout` with folds) or when the splits disagree on the number of folds.
FoldPool pool_folds(const std::vector<const SplitInfo*>& splits, const std::filesystem::path& dir);

/// read_split_info of `dir`'s train.h5, val.h5 and test.h5 (metadata only), pooled by pool_folds.
FoldPool read_fold_pool(const std::filesystem::path& dir);

/// How the folds are turned into runs.
struct CvOptions {
  /// The test folds to run, each in [1, K], ascending without repeats; empty: every fold that holds files.
  std::vector<int64_t> folds;
  /// How val is chosen: "fold-offset" (the next fold) or "ratio" (a grouped share of the training folds).
  std::string val = "fold-offset";
  /// --val ratio: the share of the training folds' files taken as val, in (0, 0.5].
  double val_ratio = 0.1;
  /// --val ratio: the seed of the group shuffle (mixed with the fold number).
  uint64_t seed = 42;

  /// Throws InvalidArgument naming --val or --folds for a value out of range.
  void validate() const;
  /// "fold-offset" or "ratio:R" (R as given).
  std::string val_text() const;
};

/// Parses --val: "fold-offset", "ratio" (R = 0.1) or "ratio:R" into `options`. Throws InvalidArgument naming --val.
void parse_val_option(const std::string& text, CvOptions& options);

/// Parses --folds "1,2,5" (ascending or not; repeats refused) into ascending fold numbers. Throws InvalidArgument
/// naming --folds.
std::vector<int64_t> parse_fold_list(const std::string& text);

/// One test fold's membership: indices into the FoldPool, ascending.
struct CvFold {
  /// The test fold, in [1, K].
  int64_t fold = 0;
  /// fold-offset: the val fold; ratio: 0.
  int64_t val_fold = 0;
  /// Pool indices of the train, val and test files.
  std::vector<int64_t> train, val, test;
};

/// The membership of every fold `options` names (validated here, against `pool` too: a named fold outside [1, K]
/// or holding no file is an InvalidArgument naming --folds; a fold whose train or val would be empty is an
/// InvalidArgument naming --val), before any training. Deterministic for a given pool and options.
std::vector<CvFold> cv_splits(const FoldPool& pool, const CvOptions& options);

/// {"fold", "val_fold" (fold-offset only), "train", "val", "test"}: each a list of [split name, row] pairs.
nlohmann::json cv_fold_json(const FoldPool& pool, const CvFold& fold);

}  // namespace melforge::data
