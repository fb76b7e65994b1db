#include "reader/clip_reader.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "melforge/common/utf8.h"

namespace melforge::data {

struct ClipReader::Impl {
  mutable std::mutex mutex;
  std::string where;
  std::string split;
  bool grid = false;
  h5::File file;
  h5::Dataset data;
  std::vector<int64_t> frame_offset;
  std::vector<int64_t> num_valid_long;
  std::vector<std::string> paths;
  int64_t n_mels = 0;
  int64_t n_frames = 0;
  int64_t num_short = 0;
  int64_t file_floats = 0;
  int64_t rows_per_chunk = 1;
  int64_t cache_bytes = 0;
  mutable std::vector<float> scratch;
  mutable std::atomic<int64_t> chunks_read{0};

  void check_clip(int64_t clip) const {
    if (clip < 0 || clip >= static_cast<int64_t>(paths.size()))
      throw InvalidArgument(where + ": clip " + std::to_string(clip) + " is outside [0, " +
                            std::to_string(paths.size()) + ")");
  }

  int64_t frames_of(int64_t clip) const {
    return frame_offset[static_cast<std::size_t>(clip) + 1] - frame_offset[static_cast<std::size_t>(clip)];
  }

  void count_chunks(int64_t first_row, int64_t rows) const {
    if (rows > 0) chunks_read += (first_row + rows - 1) / rows_per_chunk - first_row / rows_per_chunk + 1;
  }

  /// Throws FormatError naming the clip when `frames` frames of it at `out` (from its frame `first`) are not finite.
  void check_finite(int64_t clip, int64_t first, int64_t frames, const float* out) const {
    const int64_t i = first_non_finite(out, frames * n_mels);
    if (i < 0) return;
    throw FormatError(where + ": split '" + split + "', row " + std::to_string(clip) + " (file " +
                      utf8::for_terminal(paths[static_cast<std::size_t>(clip)]) + "): the spectrogram holds " +
                      (std::isnan(out[i]) ? "NaN" : "an infinite value") + " (frame " +
                      std::to_string(first + i / n_mels) + "); rebuild the dataset, or remove the file");
  }

  /// Schema 1/2: frames [first, first + count) of the clip whose `mel` row (float32 [L][S][M][T]) is at `row`, as
  /// [count][M] into `out`.
  void transpose_segments(const float* row, int64_t first, int64_t count, float* out) const {
    for (int64_t i = first; i < first + count;) {
      const int64_t segment = i / n_frames, t0 = i % n_frames;
      const int64_t t1 = std::min(n_frames, t0 + (first + count - i));
      const float* seg = row + segment * n_mels * n_frames;
      for (int64_t t = t0; t < t1; ++t) {
        float* dst = out + (i - first + t - t0) * n_mels;
        for (int64_t m = 0; m < n_mels; ++m) dst[m] = seg[m * n_frames + t];
      }
      i += t1 - t0;
    }
  }

  /// Schema 1/2: reads files [first, first + count) of `mel` (count <= rows_per_chunk) into scratch.
  const float* read_grid_rows(int64_t first, int64_t count) const {
    scratch.resize(static_cast<std::size_t>(count * file_floats));
    h5::read_float(data, first, count, scratch.data());
    count_chunks(first, count);
    return scratch.data();
  }
};

ClipReader::ClipReader(const SplitInfo& split, int64_t cache_bytes) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.where = split.path.string();
  m.split = split.name;
  m.grid = split.schema_version < kClipSchemaVersion;
  m.frame_offset = split.frame_offset;
  m.num_valid_long = split.num_valid_long;
  m.paths = split.paths;
  m.n_mels = split.info.n_mels;
  m.n_frames = split.info.n_frames;
  m.num_short = split.info.num_short;
  m.file_floats = split.info.num_long * split.info.num_short * split.info.n_mels * split.info.n_frames;
  if (m.frame_offset.size() != m.paths.size() + 1)
    throw InvalidArgument(m.where + ": the split's frame_offset has " + std::to_string(m.frame_offset.size()) +
                          " entries for " + std::to_string(m.paths.size()) + " clips");
  const char* name = m.grid ? "mel" : "frames";
  m.file = h5::open_file(split.path);
  h5::Dataset probe = h5::open_dataset(m.file, name);
  const std::vector<int64_t> chunk = h5::chunk_dims(probe);
  size_t chunk_bytes = H5Tget_size(h5::dataset_type(probe).id());
  for (const int64_t c : chunk) chunk_bytes *= static_cast<size_t>(c);
  if (!chunk.empty()) m.rows_per_chunk = std::max<int64_t>(chunk[0], 1);
  const size_t bytes = std::max(static_cast<size_t>(std::max<int64_t>(cache_bytes, 0)), chunk_bytes);
  probe.close();
  m.data = h5::open_dataset(m.file, name, h5::ChunkCache::sized(bytes, chunk_bytes));
  m.cache_bytes = static_cast<int64_t>(bytes);
  const std::vector<int64_t> dims = h5::dims(m.data);
  const int64_t rows = m.grid ? static_cast<int64_t>(m.paths.size()) : split.total_frames();
  if (dims.empty() || dims[0] != rows || (m.grid ? h5::row_elements(m.data) != m.file_floats
                                                 : dims.size() != 2 || dims[1] != m.n_mels))
    throw FormatError(m.where + ": " + name + " does not have the shape the split's metadata says");
}

ClipReader::~ClipReader() = default;

int64_t ClipReader::clips() const { return static_cast<int64_t>(impl_->paths.size()); }

int64_t ClipReader::n_mels() const { return impl_->n_mels; }

int64_t ClipReader::total_frames() const { return impl_->frame_offset.back(); }

int64_t ClipReader::clip_frames(int64_t clip) const {
  impl_->check_clip(clip);
  return impl_->frames_of(clip);
}

void ClipReader::read_frames(int64_t clip, int64_t first, int64_t count, float* out) const {
  const Impl& m = *impl_;
  m.check_clip(clip);
  const int64_t frames = m.frames_of(clip);
  if (first < 0 || count < 0 || first > frames - count)
    throw InvalidArgument(m.where + ": frames [" + std::to_string(first) + ", " + std::to_string(first + count) +
                          ") are outside clip " + std::to_string(clip) + " of " + std::to_string(frames) + " frames");
  if (count == 0) return;
  std::lock_guard lock(m.mutex);
  if (m.grid) {
    m.transpose_segments(m.read_grid_rows(clip, 1), first, count, out);
  } else {
    const int64_t row = m.frame_offset[static_cast<std::size_t>(clip)] + first;
    h5::read_float(m.data, row, count, out);
    m.count_chunks(row, count);
  }
  m.check_finite(clip, first, count, out);
}

void ClipReader::read_clips(int64_t first, int64_t count, float* out) const {
  const Impl& m = *impl_;
  if (first < 0 || count < 0 || first > clips() - count)
    throw InvalidArgument(m.where + ": clips [" + std::to_string(first) + ", " + std::to_string(first + count) +
                          ") are outside [0, " + std::to_string(clips()) + ")");
  if (count == 0) return;
  std::lock_guard lock(m.mutex);
  const int64_t base = m.frame_offset[static_cast<std::size_t>(first)];
  if (!m.grid) {
    const int64_t rows = m.frame_offset[static_cast<std::size_t>(first + count)] - base;
    h5::read_float(m.data, base, rows, out);
    m.count_chunks(base, rows);
  }
  for (int64_t block = first; block < first + count;) {
    const int64_t end = m.grid ? std::min(first + count, (block / m.rows_per_chunk + 1) * m.rows_per_chunk)
                               : first + count;
    const float* rows = m.grid ? m.read_grid_rows(block, end - block) : nullptr;
    for (int64_t c = block; c < end; ++c) {
      float* dst = out + (m.frame_offset[static_cast<std::size_t>(c)] - base) * m.n_mels;
      if (m.grid) m.transpose_segments(rows + (c - block) * m.file_floats, 0, m.frames_of(c), dst);
      m.check_finite(c, 0, m.frames_of(c), dst);
    }
    block = end;
  }
}

int64_t ClipReader::chunks_read() const { return impl_->chunks_read; }

int64_t ClipReader::rows_per_chunk() const { return impl_->rows_per_chunk; }

int64_t ClipReader::chunk_of_clip(int64_t clip) const {
  impl_->check_clip(clip);
  const int64_t row = impl_->grid ? clip : impl_->frame_offset[static_cast<std::size_t>(clip)];
  return row / impl_->rows_per_chunk;
}

int64_t ClipReader::cache_bytes() const { return impl_->cache_bytes; }

}  // namespace melforge::data
