#pragma once
/// Chunk-cached reads of the `mel` dataset of one split file: whole files (aligned reads inflate each HDF5 chunk
/// once) or one short segment. Torch-free (part of melforge_data).
#include <cstdint>
#include <filesystem>
#include <memory>

namespace melforge::data {

/// Reads ranges of files from the `mel` dataset of one split file, through an HDF5 chunk cache of its own sized
/// for the file's chunk shape. Keeps the file open. Thread-safe: reads are serialised by a mutex.
class MelReader {
 public:
  /// Opens `path` (a file read_split has checked) with a chunk cache of `cache_bytes` (raised to one chunk when
  /// smaller). Throws IoError when the file cannot be opened.
  MelReader(const std::filesystem::path& path, int64_t cache_bytes);
  ~MelReader();
  MelReader(const MelReader&) = delete;
  MelReader& operator=(const MelReader&) = delete;

  /// Reads files [first, first + count) as float32 into `out`, which holds count * num_long * num_short * n_mels *
  /// n_frames floats. Throws InvalidArgument when the range is outside the dataset, IoError when HDF5 fails.
  void read(int64_t first, int64_t count, float* out) const;
  /// Reads short segment `short_index` of long segment `long_index` of file `file` as float32 into `out`
  /// (n_mels * n_frames floats, [n_mels, n_frames]). Throws InvalidArgument when the indices are outside the
  /// dataset, IoError when HDF5 fails.
  void read_segment(int64_t file, int64_t long_index, int64_t short_index, float* out) const;
  /// Files in the dataset (dim 0 of `mel`).
  int64_t files() const;
  /// HDF5 chunks the reads so far covered, counted per read (a chunk covered by two reads counts twice): an upper
  /// bound on the chunks inflated, since the cache may still hold one. For tests and benchmarks.
  int64_t chunks_read() const;
  /// Files per HDF5 chunk along dim 0 (1 for a contiguous dataset): reads aligned to it inflate each chunk once.
  int64_t files_per_chunk() const;
  /// The chunk cache size in use, bytes.
  int64_t cache_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace melforge::data
