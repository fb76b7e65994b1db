#pragma once
/// What the dataset layouts share: reading a metadata table (CSV or tab-separated, bounded, every error naming the
/// file, line and field), walking the audio folders of a dataset without losing anything silently, and the small
/// checks every layout makes on what it found.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "layout.h"
#include "melforge/common/fs_walk.h"

namespace melforge::builder::layouts {

/// Largest metadata file a layout reads: 256 MiB (FSD50K's dev.csv is 4 MB, VoxCeleb1's veri_test2.txt 2.4 MB).
inline constexpr std::uintmax_t kMaxMetadataBytes = std::uintmax_t{256} << 20;

/// One row of a metadata table.
struct MetaRow {
  /// 1-based line number in the file.
  int64_t line = 0;
  /// The row's fields, as written (quotes removed, not trimmed).
  std::vector<std::string> fields;
};

/// A metadata file read whole: its header (when it has one) and its rows.
struct MetaTable {
  /// The file, as messages name it (relative to the dataset root: `meta/esc50.csv`).
  std::string name;
  /// The header row's fields; empty for a file without a header.
  std::vector<std::string> header;
  /// The data rows, blank lines left out.
  std::vector<MetaRow> rows;
};

/// Reads `root / rel` with read_regular_file (at most kMaxMetadataBytes). A missing file is a FormatError naming it
/// and `what` (what the layout needs it for); a UTF-8 byte order mark is skipped; CRLF line ends are accepted; a NUL
/// byte is refused naming the line. Fields are split with parse_csv_line (RFC 4180), or at tabs when `tabs`. With
/// `has_header` the first non-blank row is the header. Every row must have as many fields as the header (or, without
/// one, as `min_fields` or more); FormatError "file:line: ..." otherwise.
MetaTable read_table(const std::filesystem::path& root, const std::string& rel, const std::string& what,
                     bool has_header, bool tabs = false, std::size_t min_fields = 1);

/// The non-blank lines of `root / rel` (read like read_table: bounded, NUL refused, CRLF accepted), each with its
/// 1-based line number; surrounding spaces and tabs trimmed.
std::vector<MetaRow> read_lines(const std::filesystem::path& root, const std::string& rel, const std::string& what);

/// One trial of a verification list (VoxCeleb1's veri_test2.txt): `<1|0> <enroll> <test>`.
struct Trial {
  /// 1-based line number in the list.
  int64_t line = 0;
  /// 1 (same speaker) or 0.
  int label = 0;
  /// The enrollment and test paths, as written.
  std::string enroll, test;
};

/// The trials of the list `root / rel` (read_lines: bounded by kMaxMetadataBytes, NUL refused, CRLF accepted; `what`
/// says what the list is for when it is missing): every non-blank line `<1|0> <enroll> <test>`, fields separated by
/// spaces or tabs. Throws FormatError "rel:line: expected ..." for any other line, and for a list without a trial.
std::vector<Trial> read_trials(const std::filesystem::path& root, const std::string& rel, const std::string& what);

/// Finds the scanned file a trial path names: the file, or nullptr when none does. `at` ("list:line: ") is for the
/// messages of a finder that throws (a path matching several files).
using TrialFileFinder = std::function<const InputFile*(const std::string& path, const std::string& at)>;

/// The classes (InputFile::label) of the files the trials of `list` name, each path found by `find`. Throws
/// FormatError "list:line: '<path>' is not among `files_what`" for a path `find` does not know.
std::set<std::string> trial_classes(const std::vector<Trial>& trials, const std::string& list,
                                    const TrialFileFinder& find, const std::string& files_what);

/// The index of column `name` in `table`'s header (exact match after trimming, any letter case). Throws FormatError
/// naming the file, the missing column and the header found.
std::size_t column(const MetaTable& table, const std::string& name);

/// `text` without leading and trailing spaces and tabs.
std::string trim(const std::string& text);

/// `text` in lower case (ASCII).
std::string lower(std::string text);

/// "file:line: " for messages.
std::string where(const std::string& file, int64_t line);

/// The integer in field `field` of `row` (trimmed), in [lo, hi]. Throws FormatError naming the file, line, column
/// and value.
int int_field(const MetaTable& table, const MetaRow& row, std::size_t field, int lo, int hi);

/// A trimmed non-empty field `field` of `row`. Throws FormatError naming the file, line and column when it is empty.
std::string text_field(const MetaTable& table, const MetaRow& row, std::size_t field);

/// Audio files found below a folder: the path relative to the dataset root (generic '/') -> the path to open.
using AudioFiles = std::map<std::string, std::filesystem::path>;

/// Walks the folders of one dataset root (LayoutContext: extensions, hidden entries, excluded output folder), each
/// folder once whatever the links leading to it.
class DatasetWalk {
 public:
  /// A walk of `context.root`; `out` receives what is not audio (skipped with the reason), hidden and excluded entries.
  DatasetWalk(const LayoutContext& context, ScanResult& out);

  /// Every file below `dir` (recursively) whose extension is in the context's extensions. Other files go to
  /// out.skipped ("not an audio file extension"), unreadable folders, broken links and link loops with their reason;
  /// hidden entries to out.hidden. Files whose name ends with `metadata_suffix` (when not empty: LibriSpeech's
  /// `.trans.txt`) are the dataset's own metadata, neither audio nor skipped. A `dir` that is not a folder is a
  /// FormatError naming it and `what`.
  AudioFiles audio_below(const std::filesystem::path& dir, const std::string& what,
                         const std::string& metadata_suffix = "");

  /// The entries of `dir` (not recursive), as FolderWalk::list, problems and hidden entries recorded in out.
  std::vector<WalkEntry> list(const std::filesystem::path& dir);

  /// `path` relative to the dataset root, generic separators.
  std::string rel(const std::filesystem::path& path) const;

  /// True when `path`'s extension (any case) is one of the context's audio extensions.
  bool is_audio(const std::filesystem::path& path) const;

 private:
  void record(const WalkResult& result);

  const LayoutContext& context_;
  ScanResult& out_;
  FolderWalk walk_;
};

/// The root of a layout's scan, normalised (no trailing separator). Throws IoError when it is not a folder.
std::filesystem::path dataset_root(const LayoutContext& context, const std::string& layout);

/// Adds a skipped entry for every audio file of `found` that no metadata row named: "`reason`".
void skip_unlisted(const AudioFiles& found, const std::map<std::string, bool>& listed, const std::string& reason,
                   ScanResult& out);

/// Sorts out.files by rel_path and out.skipped and out.hidden by path; throws FormatError naming the layout and the
/// root when no input file was found, and when two files share a rel_path.
void finish(ScanResult& out, const std::string& layout, const std::filesystem::path& root);

/// The classes of `by_index` (filled by note_index) in the order of their indices.
std::vector<std::string> order_by_index(const std::map<int, std::string>& by_index);

/// Records that `label` has index `index` (row `row` of `table`) in `by_index`; FormatError naming the line when
/// the index or the class was given another partner before.
void note_index(std::map<int, std::string>& by_index, int index, const std::string& label, const MetaTable& table,
                const MetaRow& row);

/// Field `field` of `row` as a file name: text_field, and no '/' or '\\' in it, not "." or "..". Throws FormatError
/// naming the file, line and value.
std::string file_name_field(const MetaTable& table, const MetaRow& row, std::size_t field);

/// A warning in out.warnings for every group whose files lie in more than one fold (at most 5 named, then a count):
/// the dataset's folds were meant to keep each `group_name` in one fold.
void warn_groups_across_folds(ScanResult& out, const std::string& group_name);

/// A warning naming the folds of 1..out.folds that hold no file (a partial copy of the dataset: cross-validation
/// over those folds has nothing to test on).
void warn_empty_folds(ScanResult& out);

/// A warning when `missing` files listed in `list` were not found on disk (each is in out.skipped).
void warn_missing(ScanResult& out, std::size_t missing, const std::string& list);

/// A 64-bit FNV-1a hash of `text`: stable across platforms and runs (deterministic hold-outs).
uint64_t stable_hash(const std::string& text);

}  // namespace melforge::builder::layouts
