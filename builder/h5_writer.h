#pragma once
/// Writes one split's HDF5 file: parallel-compressed chunks written with HDF5's direct chunk write.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "mel/mel_args.h"

namespace melforge::builder {

/// A root attribute: integer, floating point or UTF-8 string.
struct Attribute {
  /// Attribute name (e.g. "n_fft").
  std::string name;
  /// Value; int64 is stored as H5T_NATIVE_INT64, double as H5T_NATIVE_DOUBLE, strings as variable-length UTF-8.
  std::variant<int64_t, double, std::string> value;
};

/// Per-file metadata stored beside the spectrograms.
struct FileRecord {
  /// Class index into class_names.
  int32_t label = 0;
  /// Path relative to the input root, or as written in the manifest (UTF-8).
  std::string path;
  /// Long segments that hold audio.
  int32_t num_valid_long = 0;
};

/// Everything the writer needs up front.
struct SplitWriterConfig {
  /// Final path, e.g. OUT/train.h5. The file is written as `<final_path>.partial` and renamed by finish().
  std::filesystem::path final_path;
  /// Split name stored in the `split` attribute.
  std::string split;
  /// Shape of one file's spectrograms: [num_long, num_short, n_mels, n_frames].
  std::vector<int64_t> file_shape;
  /// Stored element type of `mel`.
  mel::DType dtype = mel::DType::float16;
  /// Deflate level 1..9, or 0 for no compression (the chunks are then stored raw).
  int compression_level = 4;
  /// Apply HDF5's shuffle filter before deflate.
  bool shuffle = true;
  /// Files per HDF5 chunk; 0 picks one so that a chunk is about 1 MiB uncompressed (at least 1 file).
  int files_per_chunk = 0;
  /// Threads that compress chunks (0: all cores).
  int threads = 0;
  /// Class names, indexed by label; written as `class_names`.
  std::vector<std::string> class_names;
  /// Root attributes (schema_version, split and melforge_version are added by the writer).
  std::vector<Attribute> attributes;
};

/// Schema version written to every file's `schema_version` attribute.
inline constexpr int64_t kSchemaVersion = 1;

/// Writes one split. Files are appended in order; the file appears at final_path only after finish() succeeds.
/// If the writer is destroyed before finish(), the partial file is removed.
class SplitWriter {
 public:
  /// Creates `<final_path>.partial` (replacing a stale one) and the extensible `mel` dataset.
  /// Throws IoError if it cannot be created.
  explicit SplitWriter(SplitWriterConfig config);
  ~SplitWriter();
  SplitWriter(const SplitWriter&) = delete;
  SplitWriter& operator=(const SplitWriter&) = delete;

  /// Appends `records.size()` files. `mel` holds [records.size()][file_shape...] elements of the configured dtype.
  /// Whole chunks are shuffled and deflated in parallel and written with H5Dwrite_chunk; a partial trailing chunk
  /// is kept until more files arrive or finish(). Throws IoError on a write failure (e.g. a full disk).
  void append(const void* mel, const std::vector<FileRecord>& records);
  /// Writes the remaining chunk, `label`, `path`, `num_valid_long`, `class_names` and the attributes, closes the
  /// file, and renames it to final_path. Throws IoError on failure (the partial file is removed).
  void finish();
  /// Files appended so far.
  int64_t files() const;
  /// Seconds spent compressing (summed wall time of the parallel compress phases).
  double compress_seconds() const;
  /// Seconds spent in HDF5 calls that write.
  double write_seconds() const;
  /// Compressed bytes of `mel` written so far.
  int64_t bytes_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace melforge::builder
