#pragma once
/// The checked metadata of one split file melforge-build wrote (OUT/<split>.h5, docs/FORMAT.md): schema version,
/// root attributes, class names, and per clip (file row) its label, path, frames (the clip table: frame_offset,
/// num_samples, clip_flags, for every schema) and, in schema 1/2, its valid long segments. Torch-free (part of
/// melforge_data); the trainer's Split is built from it, data::ClipReader reads the frames.
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

/// Bits of SplitInfo::clip_flags (schema 3's `clip_flags` dataset).
enum ClipFlag : uint8_t {
  /// The clip was shorter than one STFT frame and was padded to one frame.
  kClipPadded = 1,
  /// The clip was capped by the build's --max-seconds.
  kClipCapped = 2,
};
/// Every bit a clip_flags value may hold.
inline constexpr uint8_t kClipFlagsKnown = kClipPadded | kClipCapped;

/// Largest `aug_copy` value a reader accepts (melforge-build's --augment-copies is at most 64).
inline constexpr int32_t kMaxAugCopy = 64;

/// Fewest and most cross-validation folds a dataset may declare (its root attribute `folds`).
inline constexpr int64_t kMinFolds = 2;
inline constexpr int64_t kMaxFolds = 1000;

/// One split's metadata (no spectrograms).
struct SplitInfo {
  /// Split name: train, val or test.
  std::string name;
  /// The HDF5 file it was read from.
  std::filesystem::path path;
  /// The file's schema_version, in [kOldestSchemaVersion, kSupportedSchemaVersion].
  int64_t schema_version = 0;
  /// Root attributes.
  MelInfo info;
  /// Class names, indexed by label.
  std::vector<std::string> class_names;
  /// Class index per file, [files], each in [0, class_names.size()).
  std::vector<int64_t> labels;
  /// Long segments that hold audio per file, [files], each in [1, num_long] (schema 1/2; empty in schema 3).
  std::vector<int64_t> num_valid_long;
  /// Where each clip's frames start in the split's frame order, then the total: [files + 1], frame_offset[0] = 0,
  /// strictly increasing. Schema 3: the file's `frame_offset` (rows of `frames`). Schema 1/2: clip f is its valid
  /// short segments side by side in (long, short) order, num_valid_long[f] * num_short * n_frames frames, so tiles
  /// of n_frames frames with hop n_frames and min_real 0 are exactly its segments.
  std::vector<int64_t> frame_offset;
  /// Samples of each stored clip at sample_rate, [files], each >= 1 (schema 1/2: num_valid_long * long_samples).
  std::vector<int64_t> num_samples;
  /// ClipFlag bits of each clip, [files] (schema 1/2: 0).
  std::vector<uint8_t> clip_flags;
  /// Path of each file relative to the corpus root (or as in the manifest), [files].
  std::vector<std::string> paths;
  /// Multi-label targets, row-major uint8 [files, class_names.size()], 1 where the file carries the class (its
  /// `label` among them); empty when the file has no `targets` dataset (a single-label corpus, or schema 1).
  std::vector<uint8_t> targets;

  /// The file's `build_id` root attribute (one value per melforge-build run or merge, shared by its splits: a hash of
  /// what determines the build); empty for a dataset written before it existed.
  std::string build_id;

  /// True when the file holds a `targets` dataset (also for a split with no files).
  bool has_targets_dataset = false;

  /// The root attribute `folds`: the number K of cross-validation folds of the build, in [kMinFolds, kMaxFolds]; 0
  /// when the file has none (a build without folds).
  int64_t num_folds = 0;
  /// Cross-validation fold of each file, [files], each in [1, num_folds] (the `fold` dataset); empty when the build
  /// has no folds.
  std::vector<int32_t> folds;
  /// Group of each file (a speaker, a source recording: files of one group belong together), [files] (the `group`
  /// dataset, "" for a file without one); empty when the file has no `group` dataset.
  std::vector<std::string> groups;

  /// Copy index of each row, [files] (the `aug_copy` dataset of a build with --augment-copies, docs/FORMAT.md
  /// "Waveform augmentation"): 0 for a clean row, k in [1, kMaxAugCopy] for augmented copy k of the clean row
  /// before it; empty when the file has no `aug_copy` dataset (every row is its own group).
  std::vector<int32_t> aug_copy;

  /// The groups of copies: a clean row (aug_copy 0, or every row without aug_copy) and the augmented rows that
  /// follow it. [groups + 1]: group g is rows [offsets[g], offsets[g + 1]), offsets[0] = 0, last = files().
  std::vector<int64_t> group_offsets() const;

  /// True when the split carries folds (num_folds > 0).
  bool has_folds() const { return num_folds > 0; }

  /// True when the split has a multi-label `targets` matrix.
  bool multilabel() const { return has_targets_dataset; }

  /// Number of files (clips, rows).
  int64_t files() const { return static_cast<int64_t>(paths.size()); }
  /// Frames of clip `f` (>= 1): frame_offset[f + 1] - frame_offset[f]. Throws InvalidArgument outside [0, files).
  int64_t clip_frames(int64_t f) const;
  /// Frames of every clip, [files].
  std::vector<int64_t> clip_frame_counts() const;
  /// Frames of all clips: frame_offset.back() (N).
  int64_t total_frames() const { return frame_offset.empty() ? 0 : frame_offset.back(); }
  /// Schema 1/2: first valid-segment position of each file, then the total: [files + 1], position p of file f in
  /// [first[f], first[f + 1]) is long segment (p - first[f]) / num_short, short segment (p - first[f]) % num_short.
  std::vector<int64_t> segment_offsets() const;
  /// Schema 1/2: short segments that hold audio, sum over files of num_valid_long * num_short (0 in schema 3).
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

/// Index of the first NaN or infinity among data[0, n), or -1 when all n values are finite (a branch-free scan first,
/// so the common all-finite case vectorises).
int64_t first_non_finite(const float* data, int64_t n);

/// SegmentRef of valid-segment position `position` given `offsets` (SplitInfo::segment_offsets) and num_short.
/// Throws InvalidArgument when the position is outside [0, offsets.back()).
SegmentRef segment_at(const std::vector<int64_t>& offsets, int64_t num_short, int64_t position);

/// Reads one split file and checks it on its own: schema version, the `split` attribute equal to `expected_split`,
/// every parameter attribute present and well formed (read_mel_info), `label` and `path` of length F, labels within
/// the class names, the optional `targets` matrix of shape [F, classes] holding 0 or 1 with a 1 at each file's
/// label, and F small enough that the per-file metadata (about 64 bytes a file) fits in MemAvailable, checked
/// before any of it is read. Schema 1/2: `mel` of shape [F, num_long, num_short, n_mels, n_frames], `num_valid_long`
/// of length F in [1, num_long]. Schema 3: `frames` of shape [N, n_mels] (float16 or float32), integer
/// `frame_offset` [F + 1], `num_samples` [F], `clip_flags` [F], with F <= N checked from the shapes before anything
/// is read, then frame_offset[0] = 0, strictly increasing, last = N; num_samples >= 1; clip_flags within
/// kClipFlagsKnown. Optional folds (issue 30): the root attribute `folds` (K in [kMinFolds, kMaxFolds]) with the
/// integer dataset `fold` [F] in [1, K] (either one without the other is refused, except the attribute on a split
/// with no files), and the string dataset `group` [F] (bounded as `path`). Optional copies (--augment-copies): the
/// integer dataset `aug_copy` [F] in [0, kMaxAugCopy], row 0 clean (0), each augmented row (k > 0) above the row
/// before it when that one is augmented too, and with the path of its group's clean row. Every error names the file
/// and the dataset or attribute. Throws IoError when the file cannot be opened or read, FormatError when it is not
/// a valid melforge dataset of a supported schema. Every dataset is opened
/// through h5::open_dataset (no external storage, virtual sources only inside the file's folder, chunks and strings
/// bounded, declared sizes backed by stored data), and the `targets` matrix must fit in MemAvailable.
/// When the file is train.h5, val.h5 or test.h5 and carries a `build_id`, each of those beside it that carries one
/// must carry the same (read_build_id); a mix is read again up to twice (100 ms, then 200 ms later: an
/// `--overwrite` install renames the three files one after the other) and then refused with a FormatError naming
/// both files and both identifiers. Files without a build_id (written before it existed) are not compared.
SplitInfo read_split_info(const std::filesystem::path& path, const std::string& expected_split);

/// The `build_id` root attribute of the split file `path` (at most h5::kMaxStringBytes), or "" when it has none.
/// Throws IoError when the file cannot be opened, FormatError when the attribute is not a string.
std::string read_build_id(const std::filesystem::path& path);

/// `<folder>/<split>.h5` checked to exist: throws InvalidArgument for a split name other than train, val or test,
/// IoError naming the folder when it is not a folder, and IoError naming the file when it does not exist.
std::filesystem::path split_file(const std::filesystem::path& folder, const std::string& split);

/// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

}  // namespace melforge::data
