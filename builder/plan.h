#pragma once
/// The plan stages of a build, in order: scan, select (the shard's files; the bench samples instead), label (class
/// names and split assignment), probe (headers only), plan the clips (whole, or cut at --max-seconds). No audio is
/// read.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "build_state.h"
#include "scan.h"

namespace melforge::builder {

/// Records a skipped file in `skipped`, or throws StrictError naming it when `strict`.
void skip_file(std::vector<SkippedFile>& skipped, bool strict, SkippedFile file);

/// Stage "scan": lists the corpus into state.scan: the --input folder (scan_folder, leaving out the output folder
/// when it lies inside the input and hidden entries unless --include-hidden), the --layout's scan of --input
/// (layouts::find_layout), or the --manifest (scan_manifest with --columns, --label-sep, --audio-root, --classes,
/// --group-by). Then --classes (read_class_list; labels outside it are a FormatError), --group-by REGEX
/// (apply_group_regex) and the folds (every file has one when any has, unless --folds assigns the rest; --folds at
/// least the largest). Prints the scan's warnings and protocol notes. Throws IoError, FormatError or
/// InvalidArgument.
void scan_corpus(BuildState& state);

/// Takes the scan's entries [skipped.first, skipped.second) as the skipped entries this run reports (recorded in
/// state.skipped, or StrictError under --strict). Throws FormatError when the scan found no audio file.
void accept_scan(BuildState& state, std::pair<int64_t, int64_t> skipped);

/// Memory the build holds per scanned entry (file or skipped entry) besides --max-ram, at its peak (the report): its
/// paths, label, probe result and skipped-list entry. Measured (issue 29, 48-character paths, peak RSS of 20,000 and
/// 200,000 missing files in a manifest under --max-ram 64M: 76 and 440 MB): 2.07 KB per entry (2.94 KB before).
inline constexpr int64_t kListedEntryBytes = 2100;

/// The build's selection: the files and scan-skipped entries of --shard K/N (all of them unsharded), through
/// accept_scan; sets files_range, skipped_range and scanned. Warns (stderr and the report) when the list of entries
/// (kListedEntryBytes each) takes more than --max-ram, which does not bound it.
void select_shard(BuildState& state);

/// Folds, class names and splits: --folds K assigns the missing folds (assign_folds), files with a fold and no split
/// get theirs by the fold -> split rule (splits_from_folds; a warning when --split was given too); class names are
/// scan.class_order (--classes, a layout's vocabulary; a listed class without a file is kept with a warning) or the
/// sorted labels; with --test-trials, the classes of the list's paths go to test (matched exactly, else as the one
/// stored path ending in "/<path>"; an unknown path is a FormatError naming list:line; a corpus that gives splits is
/// refused) and the list becomes scan.trials; the split of every file whose layout, manifest or fold gave none
/// (assign_splits with --split (train and val rescaled to sum to 1 with --test-trials),
/// --seed and --split-by, grouped when files have groups; InvalidArgument when --split-by class meets a class in two
/// given splits or a multi-label row). Warns about groups in two splits or folds (group_leaks). With
/// --augment-copies, throws InvalidArgument when --augment-splits names a split that no file went to. Warns (stderr
/// and report) about labels that differ only in case, suspicious layouts (a single class, class names like fold1 or
/// train, names starting with '_', classes of one file) and mel bands that hold no FFT bin
/// (mel::empty_bands_warning: torchaudio warns and computes, and so do we; not for --features fbank). Last, with
/// --speed-speakers, appends the new classes `<class>_sp<factor>` (state.speed_speakers; InvalidArgument for a
/// multi-label corpus or a new name that is already a class).
void label_files(BuildState& state);

/// Stage "probe": reads the header of every file of files_range on state.threads threads; failures go to
/// probe_error. With `show_progress` a progress bar is printed (unless --quiet). Throws Interrupted.
void probe_files(BuildState& state, bool show_progress);

/// Plans every file of files_range in order: a failed probe, a --channel the file does not have or a file whose
/// header says it holds no sample is skipped at "probe"; every other file goes to state.usable with its ClipPlan
/// (plan_clip: whole, or its first --max-seconds; nothing is skipped for being short). Throws StrictError under
/// --strict. Unsharded, throws FormatError when a split that was given files keeps none ("train would be empty: all
/// 12 files were skipped (12 'channel 5 requested but the file has 1 channel')"), before any audio is decoded;
/// warns (stderr and report) when the ratios leave a split empty or a class has no training file (with --split-by
/// class: a train class whose files were all skipped).
void plan_clip_files(BuildState& state);

/// After the batches of an unsharded build: throws FormatError naming the split and the skip reasons when the files
/// `skipped` by the audio stages emptied a split the plan had filled ("val would be empty: all 3 files were skipped
/// (...)"), before anything is installed; warns (stderr and the report) about classes left without a training
/// file.
void check_written_splits(BuildState& state, const std::vector<SkippedFile>& skipped);

/// Adds the scan's notes to the build report: files.hidden (the number of hidden entries; 0 in shards 2..N, so that
/// the merged sum counts them once), "hidden" {"count", "paths"} (entries whose name starts with '.', not read; a
/// hidden folder is one entry), "excluded" [{"path", "reason"}] (the output folder inside the input) and
/// "warnings" [text] (labels differing only in case, empty splits, classes without a training file, suspicious
/// layouts, groups leaking across splits) and "protocol" (protocol_json).
void add_scan_notes(nlohmann::json& report, const BuildState& state);

/// With --layout, --augment-copies > 0 and no --noise: takes the layout's noise bank (state.scan.noise_bank) as
/// --noise, in `config` (which must be state.config) and in the augmentation stage, with a note on stderr, then checks
/// the augmentation again (no bank and nothing else to augment with: InvalidArgument naming --augment-copies).
/// Returns the bank used, or "" when none was taken.
std::string use_layout_noise_bank(BuildConfig& config, BuildState& state);

/// Copies the layout's trial list `trials` (read_regular_file, at most 256 MiB) into `staging` as trials.txt
/// (kTrialsName); returns the staged path. Throws InvalidArgument, FormatError or IoError.
std::filesystem::path stage_trials(const std::filesystem::path& trials, const std::filesystem::path& staging);

/// The report's `protocol.test_trials`: {"list": as given, "trials", "speakers" (the test classes), "files"}, or null
/// without --test-trials.
nlohmann::json test_trials_json(const TestTrials& trials);

/// The report's `protocol` object (docs/FORMAT.md): {"layout": name or null, "folds": K (0 none), "fold_counts":
/// {"1": files, ...}, "split_rule": the fold -> split rule or null, "group_by": what the groups were taken from or
/// null, "groups": distinct groups, "class_order": "sorted" | "classes file" | "layout vocabulary", "noise_bank":
/// null (the build sets it when it uses the layout's bank), "trials": null (the build sets "trials.txt"), "notes":
/// [text]}; counted over the whole corpus (every shard reports the same).
nlohmann::json protocol_json(const BuildState& state);

/// FNV-1a (64 bit, hex) over every scanned audio file's path, label, split, fold and group and every skipped
/// entry's path, in
/// scan order: shards of one build agree on it, shards of different corpora, seeds or split ratios do not.
std::string corpus_fingerprint(const ScanResult& scan);

}  // namespace melforge::builder
