#pragma once
/// Chunk-cached reads of a split's clips as frames, the one reader of spectrograms for every schema: schema 3 reads
/// rows of `frames` ([N, n_mels], float16 converted), schema 1/2 reads the file rows of `mel` and lays each valid short
/// segment out frame-major ([n_mels][n_frames] -> [n_frames][n_mels]), the clip being its valid segments side by side
/// (SplitInfo::frame_offset). Torch-free (part of melforge_data).
#include <cstdint>
#include <memory>

#include "reader/split_info.h"

namespace melforge::data {

/// Reads frames of the clips of one split file through an HDF5 chunk cache of its own. Keeps the file open.
/// Thread-safe: reads are serialised by a mutex.
class ClipReader {
 public:
  /// Opens split.path (a file read_split_info has checked; its clip table is copied) with a chunk cache of
  /// `cache_bytes` (raised to one chunk when smaller). Throws IoError when the file cannot be opened, FormatError
  /// when the spectrogram dataset does not have the shape `split` says.
  ClipReader(const SplitInfo& split, int64_t cache_bytes);
  ~ClipReader();
  ClipReader(const ClipReader&) = delete;
  ClipReader& operator=(const ClipReader&) = delete;

  /// Clips (files, rows) of the split (F).
  int64_t clips() const;
  /// Mel bands (M).
  int64_t n_mels() const;
  /// Frames of all clips (N).
  int64_t total_frames() const;
  /// Frames of clip `clip`. Throws InvalidArgument outside [0, clips).
  int64_t clip_frames(int64_t clip) const;

  /// Frames [first, first + count) of clip `clip` as float32 [count][n_mels] (frame-major) into `out`. Throws
  /// InvalidArgument when the clip or the range is outside the split (count 0 reads nothing), FormatError naming the
  /// file, the clip and its path when a value read is NaN or infinite, IoError when HDF5 fails.
  void read_frames(int64_t clip, int64_t first, int64_t count, float* out) const;
  /// Clips [first, first + count) whole, frame-major, clip after clip: float32 [frame_offset[first + count] -
  /// frame_offset[first]][n_mels]. Throws as read_frames.
  void read_clips(int64_t first, int64_t count, float* out) const;

  /// HDF5 chunks the reads so far covered, counted per read (an upper bound on the chunks inflated). For tests and
  /// benchmarks.
  int64_t chunks_read() const;
  /// Schema 3: frames (rows of `frames`) per HDF5 chunk. Schema 1/2: files per chunk of `mel` (a chunk holds whole
  /// files). 1 for a contiguous dataset.
  int64_t rows_per_chunk() const;
  /// The HDF5 chunk that holds the first frame of clip `clip` (schema 3: frame_offset[clip] / rows_per_chunk; schema
  /// 1/2: clip / rows_per_chunk): clips of one chunk read together inflate it once.
  int64_t chunk_of_clip(int64_t clip) const;
  /// The chunk cache size in use, bytes.
  int64_t cache_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace melforge::data
