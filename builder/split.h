#pragma once
/// Seeded, order-independent split assignment: stratified by class (`--split-by file`) or by whole classes
/// (`--split-by class`, open-set).
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "scan.h"

namespace melforge::builder {

/// What `--split` divides among the splits.
enum class SplitBy {
  /// The files of each class: every class in every split (closed-set; the default).
  file,
  /// Whole classes: each class (speaker) in exactly one split (open-set).
  class_,
};
/// "file" or "class".
std::string to_string(SplitBy by);
/// Parses "file" or "class" in any letter case. Throws InvalidArgument naming --split-by and the accepted values.
SplitBy parse_split_by(const std::string& text);
/// Reads one token with parse_split_by (for Boost.Program_options).
std::istream& operator>>(std::istream& in, SplitBy& by);
/// Writes to_string(by).
std::ostream& operator<<(std::ostream& out, SplitBy by);

/// Seeded draws that assign_class_splits compares.
inline constexpr int kClassSplitDraws = 64;

/// Assigns a split to every file whose split is -1. When any file has a group (InputFile::group) and `by` is file:
/// assign_group_splits. Otherwise, within each class, the files still to assign are ordered by a
/// keyed hash of (seed, rel_path) and the first round(n*ratios[0]) go to train, the next round(n*ratios[1]) to val,
/// the rest to test. The result depends only on the set of (rel_path, label) pairs, the seed and the ratios: not on
/// the order of `files` nor on any thread count. Files that already have a split keep it. With `by` class:
/// assign_class_splits.
void assign_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed,
                   SplitBy by = SplitBy::file);

/// `--split-by class`: every class goes wholly to one split. Files that already have a split keep it; a class with
/// such files goes wholly to their split (its other files follow). The remaining C classes ("free"; F files) are
/// counted out as the file mode counts files: train gets k0 = min(C, round(C*ratios[0])) classes, val
/// k1 = min(C-k0, round(C*ratios[1])), test the rest. Which classes: draw d (0..kClassSplitDraws-1) orders the free
/// classes by class_split_key(name, seed, d) (then name) and gives the first k0 to train, the next k1 to val, the
/// rest to test; the draw whose file counts n_s are nearest to the ratios (least sum over s of |n_s - F*ratios[s]|,
/// ties to the lower d) is kept. The result depends only on the set of (rel_path, label, split) triples, the seed
/// and the ratios. Throws InvalidArgument naming the class, the two splits and a file of each when the given splits
/// put one class in two splits, and naming the file for a multi-label row (its class is not one name).
void assign_class_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed);

/// Grouped split assignment (--group-by): every group (files of one non-empty InputFile::group; a file without a
/// group is a group of its own) goes wholly to one split. A group with a given split sends its other files there
/// (the lowest given split when its files were given several: group_leaks warns about it). The other groups are
/// taken largest first, then by the keyed hash split_key(group, seed), then by name, and each goes to the split s
/// (ratios[s] > 0) whose weighted fill of the group's classes is lowest: sum over the group's classes c of
/// n_gc * (count_sc + n_gc / 2) / (ratios[s] * T_c), where n_gc are the group's files of class c (every label of a
/// multi-label file counts), count_sc the files of class c put in s so far and T_c the files of class c to assign
/// (Webster's rounding, so the split sizes follow the ratios as closely as whole groups allow); ties go to the
/// lower overall fill, then to the lower split. Depends only on the set of files (paths, labels, groups, given
/// splits), the seed and the ratios.
void assign_group_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed);

/// --folds K: assigns a fold 1..K to every file whose fold is 0, by the rule of assign_group_splits with K equal
/// bins: a group with a given fold sends its other files there; the others go largest first to the fold whose count
/// of the group's classes (given folds included) is lowest, ties to the fold with fewer files, then the lower fold.
/// Throws InvalidArgument naming --folds when a given fold exceeds `folds`.
void assign_folds(std::vector<InputFile>& files, int folds, uint64_t seed);

/// The fold -> split rule of a build: every file with a fold and no split gets test for fold `folds`, val for fold
/// `folds` - 1 and train for the others; with 2 folds, test for fold 2 and train for fold 1 (no val). Returns the
/// files it gave a split.
int64_t splits_from_folds(std::vector<InputFile>& files, int folds);

/// Leakage warnings: each group whose files lie in two splits, and each group whose files lie in two folds, named
/// with a file of each (at most `max_warnings` of each kind, then how many more).
std::vector<std::string> group_leaks(const std::vector<InputFile>& files, std::size_t max_warnings = 10);

/// The keyed hash used to order files: SplitMix64 over FNV-1a of `rel_path` mixed with `seed`.
uint64_t split_key(const std::string& rel_path, uint64_t seed);

/// The keyed hash that orders the classes in draw `draw` of assign_class_splits:
/// split_key(class_name, splitmix64(seed) + draw).
uint64_t class_split_key(const std::string& class_name, uint64_t seed, int draw);

}  // namespace melforge::builder
