#pragma once
/// Finds the input files of a build: a class-per-folder tree, a tree already split, or a CSV manifest.
#include <filesystem>
#include <string>
#include <vector>

namespace melforge::builder {

/// One input file.
struct InputFile {
  /// Path used to open the file.
  std::filesystem::path path;
  /// Path stored in the dataset: relative to the input root (generic '/' separators), or as written in the manifest.
  std::string rel_path;
  /// Class name.
  std::string label;
  /// Split index (0 train, 1 val, 2 test) given by the layout or manifest; -1 when it is to be assigned.
  int split = -1;
};

/// A file that did not make it into the dataset, and why.
struct SkippedFile {
  /// Path as stored (relative to the input root, or as in the manifest).
  std::string path;
  /// Human-readable reason, e.g. "not an audio file: ...".
  std::string reason;
  /// Stage that rejected it: scan, probe, segment or decode.
  std::string stage;
};

/// What a scan found.
struct ScanResult {
  /// Audio files, sorted by rel_path.
  std::vector<InputFile> files;
  /// Entries that were found but cannot be inputs (wrong extension, outside a class folder, broken link, ...).
  std::vector<SkippedFile> skipped;
  /// True when the layout or manifest gave the splits (all or some).
  bool presplit = false;
};

/// Scans `root`. If every sub-folder of root is named train, val or test, the tree is taken as already split
/// (`root/<split>/<class>/**`); otherwise each sub-folder is a class. Files whose extension (case-insensitive) is not
/// in `extensions` and files outside a class folder are listed as skipped. Symbolic links to files are followed;
/// links to folders are not (listed as skipped), so a link loop cannot hang the scan. Throws IoError if root cannot
/// be read.
ScanResult scan_folder(const std::filesystem::path& root, const std::vector<std::string>& extensions);

/// Reads a CSV manifest: `path,label[,split]` per row, an optional header row starting with `path`, RFC 4180 quoting,
/// blank lines ignored. Relative paths are resolved against the manifest's folder. Throws FormatError naming the line
/// for a malformed row, an empty label or an unknown split name.
ScanResult scan_manifest(const std::filesystem::path& manifest);

/// Parses one CSV line into fields (RFC 4180: quotes, doubled quotes inside quotes). Throws FormatError on an
/// unterminated quote.
std::vector<std::string> parse_csv_line(const std::string& line);

}  // namespace melforge::builder
