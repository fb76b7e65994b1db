#include "plan.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "augment_stage.h"
#include "h5_writer.h"
#include "layouts/layout.h"
#include "layouts/layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/fs_walk.h"
#include "melforge/common/parallel.h"
#include "melforge/common/progress.h"
#include "melforge/common/utf8.h"
#include "mel/filterbank.h"
#include "output_folder.h"
#include "split.h"
#include "stop.h"
#include "verification/verification.h"

namespace melforge::builder {

namespace {

/// Whether probe_files reads the header of scan.files[i]: the files this run writes.
bool probed(const BuildState& state, int64_t i) {
  return i >= state.files_range.first && i < state.files_range.second;
}

/// `reason` without the "<path>: " prefix decode and probe errors start with, for counting reasons over files.
std::string reason_kind(const InputFile& in, const std::string& reason) {
  const std::string prefix = in.path.string() + ": ";
  return reason.compare(0, prefix.size(), prefix) == 0 ? reason.substr(prefix.size()) : reason;
}

/// "all N files were skipped (a 'reason', b 'other reason', ...)" for the skip reasons `kinds` (reason -> files) of
/// one split: the three most frequent reasons with their counts.
std::string skip_summary(const std::map<std::string, int64_t>& kinds) {
  std::vector<std::pair<int64_t, std::string>> top;
  int64_t files = 0;
  for (const auto& [k, c] : kinds) {
    top.emplace_back(-c, k);
    files += c;
  }
  std::sort(top.begin(), top.end());
  std::string s = "all " + std::to_string(files) + (files == 1 ? " file was" : " files were") + " skipped (";
  for (std::size_t i = 0; i < top.size() && i < 3; ++i)
    s += (i ? ", " : "") + std::to_string(-top[i].first) + " '" + top[i].second + "'";
  return s + (top.size() > 3 ? ", ...)" : ")");
}

/// Keeps the warning about a capped --threads (printed when the flag was parsed) for the report.
void note_threads_cap(BuildState& state) {
  if (const std::string w = threads_cap_warning(state.config.build.threads); !w.empty())
    state.scan.warnings.push_back(w);
}

/// Prints `text` as a warning and keeps it for the report.
void warn(BuildState& state, const std::string& text) {
  std::fprintf(stderr, "melforge-build: warning: %s\n", text.c_str());
  state.scan.warnings.push_back(text);
}

/// Warns when the list of scanned entries (kListedEntryBytes each) takes more memory than --max-ram, which bounds
/// the audio and output buffers only.
void warn_list_memory(BuildState& state) {
  const auto entries = static_cast<int64_t>(state.scan.files.size() + state.scan.skipped.size());
  const int64_t bytes = entries * kListedEntryBytes;
  const int64_t max_ram = state.config.build.max_ram_bytes();
  if (bytes <= max_ram) return;
  const auto mib = [](int64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20); };
  warn(state, "the list of " + std::to_string(entries) + " scanned entries takes about " + mib(bytes) +
                  " MiB (about " + std::to_string(kListedEntryBytes) + " bytes each: paths, labels, probe results "
                  "and the report's skipped list), beyond --max-ram " + mib(max_ram) + " MiB, which bounds only the "
                  "audio and output buffers; --shard K/N bounds it per process");
}

/// Warns about labels that differ only in case ("Dog" and "dog"): they are distinct classes.
void warn_case_labels(BuildState& state) {
  std::map<std::string, std::vector<std::string>> by_lower;
  for (const auto& name : state.class_names) {
    std::string l = name;
    for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    by_lower[l].push_back(name);
  }
  for (const auto& [l, names] : by_lower) {
    if (names.size() < 2) continue;
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
    warn(state, "labels " + list + " differ only in case: they are " + std::to_string(names.size()) +
                    " different classes");
  }
}

/// Every label of `f` (its labels, or its one label).
std::vector<std::string> labels_of(const InputFile& f) {
  return f.labels.empty() ? std::vector<std::string>{f.label} : f.labels;
}

/// "'a', 'b', 'c'" for the first `max` of `names`, then ", ... (N in all)".
std::string name_list(const std::vector<std::string>& names, std::size_t max = 10) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > max) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

/// True for a class name that looks like a fold or a split folder (fold1, fold_3, split2, train, dev, eval, ...).
bool fold_or_split_name(const std::string& name) {
  static const std::regex numbered("^(fold|split|set|part|partition|subset)[ _-]?[0-9]+$", std::regex::icase);
  static const std::set<std::string> splits{"train", "training", "test", "testing", "val", "valid", "validation",
                                            "dev", "development", "eval", "evaluation"};
  std::string lower = name;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return splits.contains(lower) || std::regex_match(name, numbered);
}

/// Warns about a layout that is probably not what the user meant: a single class, class names that look like folds
/// or splits, classes whose name starts with '_', classes with a single file.
void warn_suspicious_layout(BuildState& state) {
  std::map<std::string, int64_t> files;
  for (const auto& f : state.scan.files)
    for (const auto& l : labels_of(f)) ++files[l];
  const bool folder = !state.config.build.input.empty() && state.config.build.layout.empty();
  const std::string what = folder ? "class folder" : "class";
  if (state.class_names.size() == 1)
    warn(state, "a single class, '" + state.class_names[0] + "': a classifier needs two or more; " +
                    (folder ? "is --input one folder too high or too low (each sub-folder of --input is a class)? A "
                              "dataset with a metadata file is read with --layout NAME or --manifest --columns"
                            : "check the label column"));
  std::vector<std::string> fold_like, underscore, single;
  for (const auto& name : state.class_names) {
    if (fold_or_split_name(name)) fold_like.push_back(name);
    if (!name.empty() && name[0] == '_') underscore.push_back(name);
    if (files[name] == 1) single.push_back(name);
  }
  if (!fold_like.empty())
    warn(state, what + " names that look like folds or splits, not classes: " + name_list(fold_like) +
                    " (UrbanSound8K's audio/fold1..fold10 are folds: its classes are in its metadata CSV; use "
                    "--layout NAME or --manifest --columns ...,fold=COL)");
  for (const auto& name : underscore)
    warn(state, what + " '" + name + "' starts with '_': such folders usually hold something else than a class "
                    "(Speech Commands' _background_noise_ is a noise bank: --layout speechcommands, or move it out "
                    "and give it as --noise)");
  if (!single.empty())
    warn(state, std::to_string(single.size()) + (single.size() == 1 ? " class has" : " classes have") +
                    " a single file, which cannot be in both train and test: " + name_list(single));
}

/// --folds K assigns the missing folds; then the fold -> split rule gives files with a fold and no split theirs.
void apply_folds(BuildState& state) {
  const BuildOptions& bo = state.config.build;
  ScanResult& scan = state.scan;
  if (bo.folds > 0) {
    assign_folds(scan.files, bo.folds, bo.seed);
    scan.folds = bo.folds;
  }
  if (scan.folds == 0) return;
  const int64_t n = splits_from_folds(scan.files, scan.folds);
  if (n == 0) return;
  scan.presplit = true;
  const int k = scan.folds;
  const std::string note =
      "split from folds (" + std::to_string(n) + " files): fold " + std::to_string(k) + " -> test, " +
      (k > 2 ? "fold " + std::to_string(k - 1) + " -> val, folds 1.." + std::to_string(k - 2) + " -> train"
             : "fold 1 -> train (2 folds: no val)") +
      "; `melforge-train cv` re-partitions by fold";
  scan.protocol_notes.push_back(note);
  if (!bo.quiet) std::fprintf(stderr, "melforge-build: %s\n", note.c_str());
  if (bo.split_given)
    warn(state, "--split " + bo.split + " is not used: the files' splits come from their folds (fold " +
                    std::to_string(k) + " test, fold " + std::to_string(k - 1) + (k > 2 ? " val" : " train") +
                    ", the others train)");
}

/// class_names: scan.class_order when given (every label must be in it; a listed class without a file is kept,
/// with a warning), else the sorted labels.
void set_class_names(BuildState& state) {
  std::set<std::string> labels;
  for (const auto& f : state.scan.files)
    for (const auto& l : labels_of(f)) labels.insert(l);
  const std::vector<std::string>& order = state.scan.class_order;
  if (order.empty()) {
    state.class_names.assign(labels.begin(), labels.end());
    return;
  }
  const std::set<std::string> listed(order.begin(), order.end());
  for (const auto& l : labels)
    if (!listed.contains(l)) throw FormatError("label '" + l + "' is not in the class order of the corpus");
  std::vector<std::string> empty;
  for (const auto& c : order)
    if (!labels.contains(c)) empty.push_back(c);
  if (!empty.empty())
    warn(state, std::to_string(empty.size()) + " listed " + (empty.size() == 1 ? "class has" : "classes have") +
                    " no file (kept, so that every class keeps its index): " + name_list(empty));
  state.class_names = order;
}

/// What the plan (or the batches) did with the files of each split: kept, or skipped with the reason.
struct SplitTally {
  /// [split]: files kept.
  std::array<int64_t, 3> kept{};
  /// [split]: files skipped per reason (without the path prefix): one entry per reason, not per file.
  std::array<std::map<std::string, int64_t>, 3> skipped;
  /// Files kept per class in train.
  std::map<std::string, int64_t> train_kept;
  /// Files skipped per class in train.
  std::map<std::string, int64_t> train_skipped;

  /// Counts `in` as kept (in train: under every label of a multi-label file).
  void keep(const InputFile& in) {
    ++kept[static_cast<std::size_t>(in.split)];
    if (in.split == 0)
      for (const auto& l : labels_of(in)) ++train_kept[l];
  }
  /// Counts `in` as skipped for `reason` (in train: under every label).
  void skip(const InputFile& in, const std::string& reason) {
    ++skipped[static_cast<std::size_t>(in.split)][reason];
    if (in.split == 0)
      for (const auto& l : labels_of(in)) ++train_skipped[l];
  }
};

/// Why the --split ratios left a split without a file: too few classes (--split-by class), too few groups per class
/// (grouped splits keep each group whole), or too few files per class.
std::string empty_split_reason(const BuildState& state, bool by_class) {
  const std::string split = state.config.build.split;
  if (by_class) return "too few classes for --split " + split + " --split-by class";
  const bool grouped = std::any_of(state.scan.files.begin(), state.scan.files.end(),
                                   [](const InputFile& f) { return !f.group.empty(); });
  if (!grouped) return "too few files per class for --split " + split;
  return "too few groups per class for --split " + split + " (each group of " +
         (state.scan.group_by.empty() ? std::string("--group-by") : state.scan.group_by) +
         " stays in one split); --split-by class puts whole classes in each split (open-set)";
}

/// Throws FormatError naming the split and why when a split that was given files kept none ("<split> <verb>: all
/// 12 files were skipped (12 'channel 5 requested ...')"); warns when a split the ratios ask for got no file
/// (too few files per class) and when a class has no training file.
void check_splits(BuildState& state, const SplitTally& t, const std::string& verb) {
  for (std::size_t s = 0; s < 3; ++s)
    if (t.kept[s] == 0 && !t.skipped[s].empty())
      throw FormatError(kSplitNames[s] + " " + verb + ": " + skip_summary(t.skipped[s]) +
                        "; nothing was installed");
  const BuildOptions& bo = state.config.build;
  const std::vector<double> ratios = bo.split_ratios();
  const bool by_class = bo.split_by == SplitBy::class_ || state.scan.open_set;
  for (std::size_t s = 0; s < 3; ++s)
    if (t.kept[s] == 0 && t.skipped[s].empty() && !state.scan.presplit && ratios[s] > 0)
      warn(state, kSplitNames[s] + " is empty: " + empty_split_reason(state, by_class));
  for (std::size_t c = 0; c < state.speed_speakers.original_classes; ++c)
    if (const std::string& name = state.class_names[c];
        t.kept[0] > 0 && t.train_kept.count(name) == 0 && (!by_class || t.train_skipped.count(name) != 0))
      warn(state, "class '" + name + "' has no training file" +
                      (t.train_skipped.count(name) ? " (" + std::to_string(t.train_skipped.at(name)) +
                                                         " skipped)" : std::string()));
}

/// With --augment-copies, throws InvalidArgument when --augment-splits names a split that no scanned file went to
/// (e.g. val with --split 1,0,0): its copies would silently not exist.
void check_augment_splits(const BuildState& state) {
  const augment::AugmentArgs& a = state.config.augment;
  if (!a.enabled()) return;
  const std::array<bool, 3> mask = a.split_mask();
  std::array<int64_t, 3> files{};
  for (const auto& f : state.scan.files) ++files[static_cast<std::size_t>(f.split)];
  for (std::size_t s = 0; s < 3; ++s)
    if (mask[s] && files[s] == 0)
      throw InvalidArgument("--augment-splits " + a.splits + ": the corpus has no " + kSplitNames[s] +
                            " file (--split " + state.config.build.split + "); name only splits that get files");
}

/// Stage "scan" of an --input folder: the layout's scan with --layout, else scan_folder; refuses --output equal to
/// --input.
void scan_input(BuildState& state) {
  const BuildOptions& bo = state.config.build;
  std::error_code in_ec, out_ec;
  const auto in_id = folder_id(bo.input, in_ec);
  if (in_id && in_id == folder_id(bo.output, out_ec))
    throw InvalidArgument("--output '" + bo.output.string() + "' is the --input folder: the outputs cannot be "
                          "written among the inputs; choose another folder (a sub-folder of the input is left out "
                          "of the scan)");
  if (!bo.layout.empty()) {
    const layouts::Layout& layout = layouts::find_layout(bo.layout);
    state.scan = layout.scan({bo.input, bo.extension_list(), bo.include_hidden, {bo.output}});
    state.scan.layout = layout.name;
    for (const auto& w : state.scan.warnings) std::fprintf(stderr, "melforge-build: warning: %s\n", w.c_str());
  } else {
    ScanOptions options;
    options.extensions = bo.extension_list();
    options.include_hidden = bo.include_hidden;
    options.exclude = {bo.output};
    state.scan = scan_folder(bo.input, options);
  }
  for (const auto& e : state.scan.excluded) std::fprintf(stderr, "melforge-build: %s\n", e.reason.c_str());
  if (!state.scan.hidden.empty() && !bo.quiet)
    std::fprintf(stderr, "melforge-build: %zu hidden entries (names starting with '.') ignored, listed in the "
                 "report; --include-hidden scans them\n", state.scan.hidden.size());
}

/// Checks the folds the scan found: with a fold column (or layout) every file must have one unless --folds assigns
/// the rest, and --folds may not be below the largest; the fold count must be at least 2. Throws FormatError or
/// InvalidArgument.
void check_scanned_folds(BuildState& state) {
  ScanResult& scan = state.scan;
  const int folds = state.config.build.folds;
  for (const auto& f : scan.files) scan.folds = std::max(scan.folds, f.fold);
  if (scan.folds == 0) return;
  if (folds != 0 && folds < scan.folds)
    throw InvalidArgument("--folds " + std::to_string(folds) + ": the corpus already numbers folds up to " +
                          std::to_string(scan.folds) + "; give --folds " + std::to_string(scan.folds) +
                          " or more, or leave it out");
  if (folds == 0) {
    for (const auto& f : scan.files)
      if (f.fold == 0)
        throw FormatError(f.rel_path + ": has no fold while other files have one (folds 1.." +
                          std::to_string(scan.folds) + "); give every file a fold, or --folds K to assign the rest");
    if (scan.folds < 2)
      throw FormatError("every file is in fold 1: cross-validation needs at least 2 folds");
  }
}

/// Everything a build stores per file beyond path and label: fold and group (for the fingerprint).
std::string fold_group_text(const InputFile& f) {
  return f.fold == 0 && f.group.empty() ? std::string() : std::to_string(f.fold) + "/" + f.group;
}

/// --test-trials: the classes of the list's paths go wholly to test (before assign_splits, which then divides the
/// other classes between train and val); the list becomes the build's trial list (OUT/trials.txt). A corpus that
/// gives its own splits is refused (InvalidArgument), an unknown or ambiguous path is a FormatError naming the
/// list's line.
void apply_test_trials(BuildState& state) {
  const BuildOptions& bo = state.config.build;
  if (bo.test_trials.empty()) return;
  ScanResult& scan = state.scan;
  for (const auto& f : scan.files)
    if (f.split >= 0)
      throw InvalidArgument("--test-trials takes the test split from the list, but the corpus gives its own splits ('" +
                            f.rel_path + "' is in " + kSplitNames[static_cast<std::size_t>(f.split)] +
                            "): give a corpus without splits (root/<class>/..., a manifest without a split column)");
  const std::string list = bo.test_trials.string();
  const std::vector<layouts::Trial> trials = layouts::read_trials({}, list, "--test-trials");
  std::vector<std::string> stored;
  stored.reserve(scan.files.size());
  for (const auto& f : scan.files) stored.push_back(f.rel_path);
  const verification::TrialPathIndex index(std::move(stored));
  const layouts::TrialFileFinder find = [&index, &scan](const std::string& path,
                                                        const std::string& at) -> const InputFile* {
    const verification::TrialPathIndex::Match m = index.find(path);
    if (m.ambiguous > 1)
      throw FormatError(at + "'" + utf8::for_terminal(path) + "' matches " + std::to_string(m.ambiguous) +
                        " stored paths ('" + utf8::for_terminal(m.candidates[0]) + "', '" +
                        utf8::for_terminal(m.candidates[1]) + "'): write the path as stored");
    return m.index < 0 ? nullptr : &scan.files[static_cast<std::size_t>(m.index)];
  };
  const std::set<std::string> test = layouts::trial_classes(
      trials, list, find, "the corpus's stored paths (matched exactly, or as the one stored path ending in '/<path>')");
  std::vector<std::string> digest;
  for (const auto& t : trials) digest.push_back(std::to_string(t.label) + " " + t.enroll + " " + t.test);
  TestTrials& tt = state.test_trials;
  tt = {list, static_cast<int64_t>(trials.size()), static_cast<int64_t>(test.size()), 0, identity_hash(digest)};
  for (auto& f : scan.files)
    if (test.contains(f.label)) {
      f.split = 2;
      ++tt.files;
    }
  scan.trials = bo.test_trials;
  scan.protocol_notes.push_back("--test-trials " + list + ": test = the " + std::to_string(tt.speakers) +
                                " classes its " + std::to_string(tt.trials) + " trials name (" +
                                std::to_string(tt.files) + " files; the list is copied to OUT/trials.txt); the "
                                "other classes go to train and val by --split " + bo.split + " --split-by class");
}

/// The --split ratios for assign_splits: with --test-trials, train and val rescaled to sum to 1 and test 0 (the
/// list gave test its classes).
std::vector<double> split_ratios(const BuildState& state) {
  std::vector<double> r = state.config.build.split_ratios();
  if (state.config.build.test_trials.empty()) return r;
  const double sum = r[0] + r[1];
  return {r[0] / sum, r[1] / sum, 0.0};
}

/// --speed-speakers: appends the class `<class>_sp<factor>` of every original class with a train file, for each
/// factor in order (factor, then class index), to class_names and class_index. Throws InvalidArgument naming the
/// flag for a multi-label corpus and for a new name that is already a class.
void plan_speed_speakers(BuildState& state) {
  SpeedSpeakers& sp = state.speed_speakers;
  sp = {state.config.build.speed_speaker_factors(), state.class_names.size(), {}};
  if (!sp.enabled()) return;
  if (state.scan.multilabel)
    throw InvalidArgument("--speed-speakers adds one new class per class and factor; a multi-label corpus (rows with "
                          "several labels) has no single class to derive it from: leave --speed-speakers out");
  std::vector<bool> in_train(sp.original_classes, false);
  for (const auto& f : state.scan.files)
    if (f.split == 0) in_train[static_cast<std::size_t>(state.class_index.at(f.label))] = true;
  for (const double factor : sp.factors) {
    std::vector<int32_t>& labels = sp.labels.emplace_back(sp.original_classes, -1);
    for (std::size_t c = 0; c < sp.original_classes; ++c) {
      if (!in_train[c]) continue;
      const std::string name = state.class_names[c] + "_sp" + speed_text(factor);
      if (state.class_index.contains(name))
        throw InvalidArgument("--speed-speakers " + state.config.build.speed_speakers + ": the new class '" + name +
                              "' of class '" + state.class_names[c] + "' at speed " + speed_text(factor) +
                              " is already a class of the corpus");
      labels[c] = static_cast<int32_t>(state.class_names.size());
      state.class_index[name] = labels[c];
      state.class_names.push_back(name);
    }
  }
}

}  // namespace

void skip_file(std::vector<SkippedFile>& skipped, bool strict, SkippedFile file) {
  if (strict) throw StrictError("--strict: " + file.path + ": " + file.reason);
  skipped.push_back(std::move(file));
}

void scan_corpus(BuildState& state) {
  const BuildOptions& bo = state.config.build;
  std::vector<std::string> classes;
  if (!bo.classes.empty()) classes = read_class_list(bo.classes);
  if (bo.input.empty()) {
    ManifestOptions mo;
    mo.columns = parse_columns(bo.columns);
    mo.label_sep = bo.label_separator();
    mo.audio_root = bo.audio_root;
    mo.classes = classes;
    mo.classes_name = bo.classes.string();
    mo.group_by = bo.group_by;
    state.scan = scan_manifest(bo.manifest, mo);
    for (const auto& w : state.scan.warnings) std::fprintf(stderr, "melforge-build: warning: %s\n", w.c_str());
  } else {
    scan_input(state);
  }
  note_threads_cap(state);
  if (!classes.empty() && !bo.input.empty()) apply_class_list(state.scan, classes, bo.classes.string());
  if (!bo.group_by.empty() && state.scan.group_by != "column " + bo.group_by)
    apply_group_regex(state.scan, bo.group_by);
  check_scanned_folds(state);
  for (const auto& n : state.scan.protocol_notes)
    if (!bo.quiet) std::fprintf(stderr, "melforge-build: %s\n", n.c_str());
}

void accept_scan(BuildState& state, std::pair<int64_t, int64_t> skipped) {
  const BuildOptions& bo = state.config.build;
  for (int64_t j = skipped.first; j < skipped.second; ++j)
    skip_file(state.skipped, bo.strict, state.scan.skipped[static_cast<std::size_t>(j)]);
  if (state.scan.files.empty()) {
    std::string why = std::to_string(state.scan.skipped.size()) + " entries skipped by the scan";
    if (!state.scan.hidden.empty())
      why += ", " + std::to_string(state.scan.hidden.size()) + " hidden entries ignored (--include-hidden scans them)";
    throw FormatError("train would be empty: no audio file found in " +
                      (bo.input.empty() ? bo.manifest : bo.input).string() + " (" + why + ")");
  }
}

void select_shard(BuildState& state) {
  const ShardSpec shard = state.config.build.shard_spec();
  state.files_range = shard_range(static_cast<int64_t>(state.scan.files.size()), shard);
  state.skipped_range = shard_range(static_cast<int64_t>(state.scan.skipped.size()), shard);
  state.scanned = (state.files_range.second - state.files_range.first) +
                  (state.skipped_range.second - state.skipped_range.first);
  accept_scan(state, state.skipped_range);
  warn_list_memory(state);
}

void label_files(BuildState& state) {
  apply_folds(state);
  set_class_names(state);
  state.class_index.clear();
  for (std::size_t i = 0; i < state.class_names.size(); ++i)
    state.class_index[state.class_names[i]] = static_cast<int32_t>(i);
  const BuildOptions& bo = state.config.build;
  apply_test_trials(state);
  assign_splits(state.scan.files, split_ratios(state), bo.seed, bo.split_by);
  for (const auto& w : group_leaks(state.scan.files)) warn(state, w);
  check_augment_splits(state);
  warn_case_labels(state);
  warn_suspicious_layout(state);
  plan_speed_speakers(state);
  if (state.config.mel.is_fbank()) return;
  if (const std::string empty = mel::empty_bands_warning(state.config.mel); !empty.empty()) warn(state, empty);
}

void probe_files(BuildState& state, bool show_progress) {
  const auto n = static_cast<int64_t>(state.scan.files.size());
  state.planned.assign(static_cast<std::size_t>(n), {});
  state.probe_error.assign(static_cast<std::size_t>(n), {});
  Progress progress("probe", n, "files", state.config.build.quiet || !show_progress);
  parallel_for(n, state.threads, [&](int64_t i) {
    PlannedFile& p = state.planned[static_cast<std::size_t>(i)];
    p.input = &state.scan.files[static_cast<std::size_t>(i)];
    if (!probed(state, i)) {
      progress.advance();
      return;
    }
    check_stop();
    try {
      p.stamp = file_stamp(p.input->path);
      p.info = audio::probe(p.input->path);
      p.frames = audio::output_frames(p.info, state.sample_rate);
    } catch (const AudioError& e) {
      state.probe_error[static_cast<std::size_t>(i)] = e.what();
    }
    progress.advance();
  }, 16);
}

void plan_clip_files(BuildState& state) {
  const BuildConfig& c = state.config;
  state.usable.clear();
  SplitTally tally;
  const auto [first, last] = state.files_range;
  for (auto i = static_cast<std::size_t>(first); i < static_cast<std::size_t>(last); ++i) {
    const InputFile& in = state.scan.files[i];
    PlannedFile& p = state.planned[i];
    std::string error = state.probe_error[i];
    if (error.empty() && c.decode.channel >= p.info.channels)
      error = in.path.string() + ": channel " + std::to_string(c.decode.channel) + " requested but the file has " +
              std::to_string(p.info.channels) + (p.info.channels == 1 ? " channel" : " channels");
    if (error.empty() && p.frames <= 0) error = in.path.string() + ": empty: the file holds no audio sample";
    if (!error.empty()) {
      skip_file(state.skipped, c.build.strict, {in.rel_path, error, "probe"});
      tally.skip(in, reason_kind(in, error));
      continue;
    }
    p.plan = plan_clip(p.frames, state.max_samples, c.mel);
    tally.keep(in);
    state.usable.push_back(p);
  }
  std::vector<std::string>().swap(state.probe_error);
  if (!c.build.shard_spec().sharded()) check_splits(state, tally, "would be empty");
}

void check_written_splits(BuildState& state, const std::vector<SkippedFile>& skipped) {
  if (state.config.build.shard_spec().sharded()) return;
  std::map<std::string, std::string> why;
  for (const auto& f : skipped)
    if (f.copy == 0 && !f.speed_speaker) why[f.path] = f.reason;
  SplitTally t;
  for (const PlannedFile& p : state.usable) {
    const auto it = why.find(p.input->rel_path);
    if (it == why.end()) t.keep(*p.input);
    else t.skip(*p.input, reason_kind(*p.input, it->second));
  }
  for (std::size_t s = 0; s < 3; ++s)
    if (t.kept[s] == 0 && !t.skipped[s].empty())
      throw FormatError(kSplitNames[s] + " would be empty: " + skip_summary(t.skipped[s]) + "; nothing was installed");
  for (const auto& [label, n] : t.train_skipped)
    if (t.train_kept.count(label) == 0)
      warn(state, "class '" + label + "' has no training file (" + std::to_string(n) + " skipped while decoding)");
}

void add_scan_notes(nlohmann::json& report, const BuildState& state) {
  const ShardSpec shard = state.config.build.shard_spec();
  report["files"]["hidden"] = shard.index > 1 ? std::size_t{0} : state.scan.hidden.size();
  report["hidden"] = {{"count", state.scan.hidden.size()}, {"paths", state.scan.hidden}};
  nlohmann::json excluded = nlohmann::json::array();
  for (const auto& e : state.scan.excluded) excluded.push_back({{"path", e.path}, {"reason", e.reason}});
  report["excluded"] = excluded;
  report["warnings"] = state.scan.warnings;
  report["protocol"] = protocol_json(state);
}

std::string use_layout_noise_bank(BuildConfig& config, BuildState& state) {
  augment::AugmentArgs& a = config.augment;
  if (config.build.layout.empty() || a.copies == 0 || !a.noise.empty()) return "";
  if (!state.scan.noise_bank.empty()) {
    a.noise = state.scan.noise_bank;
    if (state.augment) state.augment->use_noise_bank(a.noise);
    std::fprintf(stderr, "melforge-build: --layout %s: noise bank %s used as --noise for --augment-copies\n",
                 config.build.layout.c_str(), a.noise.c_str());
  }
  a.validate();
  return a.noise.string();
}

std::filesystem::path stage_trials(const std::filesystem::path& trials, const std::filesystem::path& staging) {
  const std::string text = read_regular_file(trials, "trial list", std::uintmax_t{256} << 20);
  const std::filesystem::path target = staging / kTrialsName;
  write_file_atomically(target, text);
  return target;
}

nlohmann::json test_trials_json(const TestTrials& t) {
  if (t.list.empty()) return nlohmann::json();
  return {{"list", t.list}, {"trials", t.trials}, {"speakers", t.speakers}, {"files", t.files}};
}

nlohmann::json protocol_json(const BuildState& state) {
  const ScanResult& scan = state.scan;
  const auto text_or_null = [](const std::string& t) { return t.empty() ? nlohmann::json() : nlohmann::json(t); };
  nlohmann::json fold_counts = nlohmann::json::object();
  std::map<int, int64_t> per_fold;
  std::set<std::string> groups;
  for (const auto& f : scan.files) {
    if (f.fold > 0) ++per_fold[f.fold];
    if (!f.group.empty()) groups.insert(f.group);
  }
  for (const auto& [fold, n] : per_fold) fold_counts[std::to_string(fold)] = n;
  const std::string order = !state.config.build.classes.empty() ? "classes file"
                            : scan.class_order.empty()         ? "sorted"
                                                               : "layout vocabulary";
  return {{"layout", text_or_null(scan.layout)},
          {"folds", scan.folds},
          {"fold_counts", fold_counts},
          {"split_rule", scan.folds > 2   ? nlohmann::json("fold K test, fold K-1 val, the other folds train")
                         : scan.folds == 2 ? nlohmann::json("fold 2 test, fold 1 train")
                                           : nlohmann::json()},
          {"group_by", text_or_null(scan.group_by)},
          {"groups", groups.size()},
          {"class_order", order},
          {"noise_bank", nlohmann::json()},
          {"trials", nlohmann::json()},
          {"test_trials", test_trials_json(state.test_trials)},
          {"notes", scan.protocol_notes}};
}

std::string corpus_fingerprint(const ScanResult& scan) {
  uint64_t h = 0xCBF29CE484222325ULL;
  const auto mix = [&h](const std::string& text) {
    for (const unsigned char c : text) {
      h ^= c;
      h *= 0x100000001B3ULL;
    }
    h ^= 0xFF;
    h *= 0x100000001B3ULL;
  };
  for (const auto& f : scan.files) {
    mix(f.rel_path);
    mix(f.label);
    for (const auto& l : f.labels) mix(l);
    mix(std::to_string(f.split));
    if (const std::string fg = fold_group_text(f); !fg.empty()) mix(fg);
  }
  for (const auto& f : scan.skipped) mix(f.path);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace melforge::builder
