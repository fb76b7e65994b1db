#pragma once
/// The checked metadata of one split file melforge-build wrote (OUT/<split>.h5, docs/FORMAT.md): schema version,
/// root attributes, class names, and per file its label, valid long segments and path; plus the index of the
/// split's valid short segments. Torch-free (part of melforge_data); the trainer's Split is built from it.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "reader/mel_info.h"

namespace melforge::data {

/// Position of one valid short segment in a split: file row, long segment and short segment.
struct SegmentRef {
  /// Row of the file in the split (dim 0 of `mel`).
  int64_t file = 0;
  /// Long segment, in [0, num_valid_long[file]).
  int64_t long_index = 0;
  /// Short segment, in [0, num_short).
  int64_t short_index = 0;
};

/// One split's metadata (no spectrograms).
struct SplitInfo {
  /// Split name: train, val or test.
  std::string name;
  /// The HDF5 file it was read from.
  std::filesystem::path path;
  /// Root attributes.
  MelInfo info;
  /// Class names, indexed by label.
  std::vector<std::string> class_names;
  /// Class index per file, [files], each in [0, class_names.size()).
  std::vector<int64_t> labels;
  /// Long segments that hold audio per file, [files], each in [1, num_long].
  std::vector<int64_t> num_valid_long;
  /// Path of each file relative to the corpus root (or as in the manifest), [files].
  std::vector<std::string> paths;
  /// Multi-label targets, row-major uint8 [files, class_names.size()], 1 where the file carries the class (its
  /// `label` among them); empty when the file has no `targets` dataset (a single-label corpus, or schema 1).
  std::vector<uint8_t> targets;

  /// True when the file holds a `targets` dataset (also for a split with no files).
  bool has_targets_dataset = false;

  /// True when the split has a multi-label `targets` matrix.
  bool multilabel() const { return has_targets_dataset; }

  /// Number of files.
  int64_t files() const { return static_cast<int64_t>(paths.size()); }
  /// First valid-segment position of each file, then the total: [files + 1], position p of file f in
  /// [first[f], first[f + 1]) is long segment (p - first[f]) / num_short, short segment (p - first[f]) % num_short.
  std::vector<int64_t> segment_offsets() const;
  /// Short segments that hold audio: sum over files of num_valid_long * num_short.
  int64_t valid_segments() const;
  /// Throws FormatError naming the split, its file, the row, the audio file's path and the position when `data`
  /// (float32 spectrograms of files [first, first + count), [count, num_long, num_short, n_mels, n_frames]) holds a
  /// NaN or an infinity.
  void check_finite(int64_t first, int64_t count, const float* data) const;
  /// Throws FormatError as check_finite when `data` (the float32 [n_mels, n_frames] spectrogram of segment `ref`)
  /// holds a NaN or an infinity.
  void check_finite_segment(const SegmentRef& ref, const float* data) const;
};

/// SplitInfo::check_finite for the split `name` of file `path` with parameters `info` and file paths `paths`.
void check_finite(const std::filesystem::path& path, const std::string& name, const MelInfo& info,
                  const std::vector<std::string>& paths, int64_t first, int64_t count, const float* data);

/// SegmentRef of valid-segment position `position` given `offsets` (SplitInfo::segment_offsets) and num_short.
/// Throws InvalidArgument when the position is outside [0, offsets.back()).
SegmentRef segment_at(const std::vector<int64_t>& offsets, int64_t num_short, int64_t position);

/// Reads one split file and checks it on its own: schema version, the `split` attribute equal to `expected_split`,
/// every parameter attribute present and well formed, `mel` of shape [F, num_long, num_short, n_mels, n_frames],
/// `label`, `num_valid_long` and `path` of length F, labels within the class names, num_valid_long in
/// [1, num_long], the optional `targets` matrix of shape [F, classes] holding 0 or 1 with a 1 at each file's label,
/// and F small enough that the per-file metadata (about 64 bytes a file) fits in MemAvailable,
/// checked before any of it is read. Throws IoError when the file cannot be opened or read, FormatError when it is
/// not a valid melforge dataset of a supported schema.
SplitInfo read_split_info(const std::filesystem::path& path, const std::string& expected_split);

/// `<folder>/<split>.h5` checked to exist: throws InvalidArgument for a split name other than train, val or test,
/// IoError naming the folder when it is not a folder, and IoError naming the file when it does not exist.
std::filesystem::path split_file(const std::filesystem::path& folder, const std::string& split);

/// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

}  // namespace melforge::data
