#pragma once
/// Finds the input files of a build: a class-per-folder tree, a tree already split, or a CSV manifest.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace melforge::builder {

/// One input file.
struct InputFile {
  /// Path used to open the file.
  std::filesystem::path path;
  /// Path stored in the dataset: relative to the input root (generic '/' separators), or as written in the manifest.
  std::string rel_path;
  /// Class name (of a multi-label row: its first label, as written).
  std::string label;
  /// Split index (0 train, 1 val, 2 test) given by the layout or manifest; -1 when it is to be assigned.
  int split = -1;
  /// Every label of a multi-label manifest row (`dog;bark`), in the order written, `labels[0] == label`; empty for a
  /// single-label row and for folder layouts.
  std::vector<std::string> labels;
  /// Fold 1..K given by a fold column, a layout or `--folds K`; 0: none (docs/FORMAT.md `fold`).
  int fold = 0;
  /// Group key (`--group-by`, a layout: Speech Commands' speaker, ESC-50's src_file, UrbanSound8K's fsID): every
  /// file of one group goes to one split and one fold; "" for none.
  std::string group;
};

/// A file that did not make it into the dataset, and why.
struct SkippedFile {
  /// Path as stored (relative to the input root, or as in the manifest).
  std::string path;
  /// Human-readable reason, e.g. "not an audio file: ...".
  std::string reason;
  /// Stage that rejected it: scan, probe, segment, decode or augment.
  std::string stage;
  /// Copy of the file that was skipped (--augment-copies): 0 for the file itself (its clean copy), k >= 1 for its
  /// augmented copy k (named in `reason` too).
  int copy = 0;
  /// True for a row of a --speed-speakers utterance (named in `reason` too), not the file's own row.
  bool speed_speaker = false;
};

/// What a scan found.
struct ScanResult {
  /// Audio files, sorted by rel_path.
  std::vector<InputFile> files;
  /// Entries that were found but cannot be inputs (wrong extension, outside a class folder, broken link, a folder
  /// that cannot be read, a link leading to a folder already scanned, ...), sorted by path.
  std::vector<SkippedFile> skipped;
  /// Hidden entries (name starting with '.') left unread, relative to the input root, sorted; a hidden folder is
  /// one entry. Not inputs: they are counted in the report, not skipped.
  std::vector<std::string> hidden;
  /// Folders left out of the scan on purpose (the build's own output folder inside the input), with the reason.
  std::vector<SkippedFile> excluded;
  /// Notes on the corpus that are not errors (labels differing only in case, ...), for stderr and the report.
  std::vector<std::string> warnings;
  /// True when the layout or manifest gave the splits (all or some).
  bool presplit = false;
  /// True when a manifest row names more than one label: the build then writes the `targets` matrix.
  bool multilabel = false;
  /// Class names in label order (`--classes FILE`, a layout's vocabulary); empty: the labels sorted. Every label of
  /// `files` is one of them; a listed class without a file is kept (its label index is stable).
  std::vector<std::string> class_order;
  /// Number of folds K the corpus declares (ESC-50: 5, UrbanSound8K: 10; `--folds K`); 0: none. Every file's fold is
  /// then in 1..K.
  int folds = 0;
  /// What the groups were taken from, for the report (`src_file`, `speaker: name before _nohash_`); "" without
  /// groups.
  std::string group_by;
  /// The layout that scanned the corpus (`esc50`), "" for a plain folder or manifest.
  std::string layout;
  /// A folder of noise clips the layout offers as the --noise bank of --augment-copies when --noise is not given
  /// (Speech Commands' `_background_noise_`); empty for none. Its files are never classes.
  std::filesystem::path noise_bank;
  /// The dataset's own trial list (VoxCeleb1's `veri_test2.txt`), checked against the scanned paths and copied to
  /// OUT/trials.txt by the build; empty for none.
  std::filesystem::path trials;
  /// True when the layout's splits hold disjoint classes on purpose (VoxCeleb1's test speakers, LibriSpeech's
  /// subsets): open-set, so a val or test class without a training file is the protocol, not a warning (the check
  /// of `--split-by class`).
  bool open_set = false;
  /// Notes on the protocol the layout applied (which list gave which split, ...), for stderr and the report's
  /// `protocol.notes`.
  std::vector<std::string> protocol_notes;
};

/// The separator of several labels in one manifest label field (`dog;bark;outdoor`), unless --label-sep says
/// otherwise.
inline constexpr char kLabelSeparator = ';';

/// Which header columns of a manifest hold what (`--columns path=COL,label=COL[,split=COL][,fold=COL][,group=COL]`):
/// each a column name of the header row, matched exactly after trimming spaces and tabs; "" for a key not given.
struct ManifestColumns {
  /// Column of the audio path (required).
  std::string path;
  /// Column of the label(s) (required).
  std::string label;
  /// Column of the split (train, val/valid/validation, test; an empty field: assigned); "" for none.
  std::string split;
  /// Column of the fold (an integer 1..1000; an empty field: none); "" for none.
  std::string fold;
  /// Column of the group key (InputFile::group); "" for none.
  std::string group;
  /// True when --columns was given.
  bool given() const { return !path.empty(); }
};

/// Parses `--columns` (`path=fname,label=labels,split=split`; keys path, label, split, fold, group; spaces around
/// names trimmed). "" gives an empty spec. Throws InvalidArgument naming --columns for an unknown key, a key given
/// twice, an empty column name, a column named for two keys, or a missing path or label key.
ManifestColumns parse_columns(const std::string& text);

/// How scan_manifest reads a manifest besides its rows.
struct ManifestOptions {
  /// --columns; when given the first non-blank row must be the header naming those columns.
  ManifestColumns columns;
  /// Separator of several labels in one label field (--label-sep; any single byte but '"', CR and LF).
  char label_sep = kLabelSeparator;
  /// Folder relative paths are resolved against (--audio-root); empty: the manifest's folder.
  std::filesystem::path audio_root;
  /// The classes of --classes FILE (read_class_list); when not empty every label must be one of them (FormatError
  /// naming the manifest line and the label).
  std::vector<std::string> classes;
  /// --group-by: when it is a column name of the header row (exact match after trimming) that column gives the
  /// groups (ScanResult::group_by "column NAME"); anything else is left for apply_group_regex.
  std::string group_by;
  /// Name of the classes file in messages.
  std::string classes_name;
};

/// Reads --classes FILE (read_regular_file, at most 16 MiB): either one class name a line (trimmed; blank lines
/// ignored), or a vocabulary CSV such as FSD50K's `vocabulary.csv` (`index,label,mid` rows, no header): when every
/// row has 3 fields and the first is an integer, the second field is the name. A UTF-8 byte order mark is skipped.
/// Throws FormatError naming the file and line for a name given twice, a row of another shape than the first, or a
/// file without a name.
std::vector<std::string> read_class_list(const std::filesystem::path& file);

/// Checks every label of `scan.files` against `classes` and sets scan.class_order to them. Throws FormatError naming
/// the file (its stored path) and the label that `classes` (named `source` in messages) lacks.
void apply_class_list(ScanResult& scan, const std::vector<std::string>& classes, const std::string& source);

/// --group-by REGEX: sets every file's group to the first capture group of `pattern` (std::regex, ECMAScript) searched
/// in its stored path, or to the whole match when the pattern has no group; scan.group_by becomes "regex PATTERN".
/// Throws InvalidArgument naming --group-by for a pattern that does not compile, FormatError naming the first path
/// it does not match (or whose group is empty); every file must have a group.
void apply_group_regex(ScanResult& scan, const std::string& pattern);

/// How scan_folder scans.
struct ScanOptions {
  /// File extensions taken as audio, lower case, without dots.
  std::vector<std::string> extensions;
  /// Scan entries whose name starts with '.' like any other (default: list them in ScanResult::hidden, unread).
  bool include_hidden = false;
  /// Folders left out of the scan (the build's output folder), matched by identity (st_dev, st_ino); a folder
  /// that does not exist is ignored.
  std::vector<std::filesystem::path> exclude;
  /// Test seam: called with each folder's path just before the scan opens it; may be empty.
  std::function<void(const std::filesystem::path&)> before_open;
};

/// The split index (0 train, 1 val, 2 test) a pre-split layout's top-level folder or a manifest's split field
/// names: train; val, valid or validation; test. -1 for any other name.
int split_index(const std::string& name);

/// Scans `root`. If a sub-folder of root is named train, val (valid, validation) or test, the tree is taken as
/// already split (`root/<split>/<class>/**`), and any other non-hidden sub-folder is an error (FormatError naming
/// it), as are two folders for one split; otherwise each sub-folder is a class. Files whose extension
/// (case-insensitive) is not in `options.extensions` and files outside a class folder are listed as skipped.
/// Symbolic links are followed, to files and to folders (a class folder may be a link); a folder is scanned once,
/// so a link loop or a second link to a folder is listed as skipped, as is every folder that cannot be read or read
/// to the end (FolderWalk, melforge/common/fs_walk.h). Hidden entries are listed in `hidden` unless
/// `include_hidden`. Throws IoError if root cannot be read.
ScanResult scan_folder(const std::filesystem::path& root, const ScanOptions& options);

/// scan_folder with default options and `extensions`.
ScanResult scan_folder(const std::filesystem::path& root, const std::vector<std::string>& extensions);

/// Reads a CSV manifest: `path,label[,split]` per row (or the columns `options` names), RFC 4180 quoting, blank
/// lines ignored. The manifest is read
/// with read_regular_file (a FIFO, a device or a folder is refused before reading, InvalidArgument); a UTF-8 byte
/// order mark (exactly EF BB BF) is skipped; a UTF-16 or UTF-32 file (its byte order mark, or NUL bytes in every other
/// position) is refused naming the encoding, and a NUL byte in a row is refused naming the line (FormatError).
///
/// Header row: the first non-blank row is a header, not a file, when it has 2 or 3 fields, every field is a word
/// (letters, digits, spaces, '_' and '-', starting with a letter: no '.' and no '/'), and its first field names no
/// existing file. When every field of the header is a known column name (any letter case: path, file, filename,
/// filepath, audio, wav, ...; label, labels, class, category, target, tag; split, subset, set, partition; fold;
/// group), 2 to 5 of them, the columns are read by name, in any order (`class,filename,fold`); otherwise (2 or 3
/// fields) in the order path,label[,split]. A header is noted in ScanResult::warnings. A row `x,dog` whose file `x`
/// exists is always data. With options.columns (--columns) the first non-blank row is the header and the named
/// columns are read (a name the header lacks: InvalidArgument naming --columns); every row then has as many fields as
/// the header.
///
/// The label field may name several labels separated by options.label_sep (`dog;bark;outdoor`, each trimmed):
/// a multi-label row (InputFile::labels, ScanResult::multilabel); an empty or repeated label in it is an error. A
/// fold field is an integer 1..1000 (0 is refused: folds are numbered from 1); ScanResult::folds is the largest.
/// Relative paths are resolved against options.audio_root, else the manifest's folder; a path without an extension
/// whose file does not exist while `<path>.wav` does is read as `<path>.wav` (FSD50K's `fname` column), and stored so.
/// Labels and split fields are
/// trimmed of surrounding spaces and tabs. Throws FormatError naming the line for a malformed row, an empty label,
/// an unknown split name, or a file listed twice: two paths that are equal once made absolute and normalised
/// lexically (`c/a/f0.wav`, `./c/a/f0.wav`, `c//a/../a/f0.wav`, `/data/c/a/f0.wav`), naming both lines.
ScanResult scan_manifest(const std::filesystem::path& manifest, const ManifestOptions& options = {});

/// One non-blank line of a text file.
struct TextLine {
  /// 1-based line number in the file.
  int64_t number = 0;
  /// The line without its '\n' and a trailing '\r' (CRLF files).
  std::string text;
};

/// The lines of `text` that hold more than spaces and tabs, numbered as in the file; a UTF-8 byte order mark
/// (exactly EF BB BF) at its start is skipped. Manifests, class lists and the layouts' metadata files are read
/// through it.
std::vector<TextLine> text_lines(const std::string& text);

/// Parses one CSV line into fields (RFC 4180: quotes, doubled quotes inside quotes). Throws FormatError on an
/// unterminated quote.
std::vector<std::string> parse_csv_line(const std::string& line);

}  // namespace melforge::builder
