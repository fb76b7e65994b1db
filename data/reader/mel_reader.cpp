#include "reader/mel_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"

namespace fs = std::filesystem;

namespace melforge::data {

struct MelReader::Impl {
  mutable std::mutex mutex;
  h5::File file;
  h5::Dataset mel;
  std::vector<int64_t> dims;
  bool half = false;
  int64_t files_per_chunk = 1;
  int64_t cache_bytes = 0;
  mutable std::atomic<int64_t> chunks_read{0};
};

MelReader::MelReader(const fs::path& path, int64_t cache_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->file = h5::open_file(path);
  h5::Dataset probe = h5::open_dataset(impl_->file, "mel");
  const std::vector<int64_t> chunk = h5::chunk_dims(probe);
  size_t chunk_bytes = H5Tget_size(h5::dataset_type(probe).id());
  for (const int64_t c : chunk) chunk_bytes *= static_cast<size_t>(c);
  if (!chunk.empty()) impl_->files_per_chunk = std::max<int64_t>(chunk[0], 1);
  const size_t bytes = std::max(static_cast<size_t>(std::max<int64_t>(cache_bytes, 0)), chunk_bytes);
  probe.close();
  impl_->mel = h5::open_dataset(impl_->file, "mel", h5::ChunkCache::sized(bytes, chunk_bytes));
  impl_->cache_bytes = static_cast<int64_t>(bytes);
  impl_->dims = h5::dims(impl_->mel);
  if (impl_->dims.size() != 5)
    throw FormatError(path.string() + ": mel has " + std::to_string(impl_->dims.size()) + " dimensions, expected 5");
  const h5::Datatype f16 = h5::float16_type();
  impl_->half = H5Tequal(h5::dataset_type(impl_->mel).id(), f16.id()) > 0;
}

MelReader::~MelReader() = default;

void MelReader::read(int64_t first, int64_t count, float* out) const {
  std::lock_guard lock(impl_->mutex);
  h5::read_float(impl_->mel, first, count, out);
  if (count > 0) {
    const int64_t fpc = impl_->files_per_chunk;
    impl_->chunks_read += (first + count - 1) / fpc - first / fpc + 1;
  }
}

void MelReader::read_segment(int64_t file, int64_t long_index, int64_t short_index, float* out) const {
  const std::vector<int64_t>& d = impl_->dims;
  if (file < 0 || file >= d[0] || long_index < 0 || long_index >= d[1] || short_index < 0 || short_index >= d[2])
    throw InvalidArgument(impl_->mel.name() + ": segment (" + std::to_string(file) + ", " +
                          std::to_string(long_index) + ", " + std::to_string(short_index) + ") is outside [" +
                          std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) + "]");
  const hsize_t start[5] = {static_cast<hsize_t>(file), static_cast<hsize_t>(long_index),
                            static_cast<hsize_t>(short_index), 0, 0};
  const hsize_t count[5] = {1, 1, 1, static_cast<hsize_t>(d[3]), static_cast<hsize_t>(d[4])};
  const hsize_t n = count[3] * count[4];
  std::lock_guard lock(impl_->mutex);
  h5::Dataspace file_space = h5::dataset_space(impl_->mel);
  h5::Dataspace mem_space(H5Screate_simple(1, &n, nullptr), "memory space");
  if (H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0)
    throw IoError(impl_->mel.name() + ": cannot select a segment");
  const h5::Datatype f16 = h5::float16_type();
  void* target = impl_->half ? static_cast<void*>(reinterpret_cast<unsigned char*>(out) + 2 * n) : out;
  if (H5Dread(impl_->mel.id(), impl_->half ? f16.id() : H5T_NATIVE_FLOAT, mem_space.id(), file_space.id(),
              H5P_DEFAULT, target) < 0)
    throw IoError(impl_->mel.name() + ": cannot read segment (" + std::to_string(file) + ", " +
                  std::to_string(long_index) + ", " + std::to_string(short_index) + ")");
  ++impl_->chunks_read;
  if (!impl_->half) return;
  const auto* halves = static_cast<const unsigned char*>(target);
  for (hsize_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, halves + 2 * i, sizeof h);
    out[i] = h5::half_to_float(h);
  }
}

int64_t MelReader::files() const { return impl_->dims[0]; }

int64_t MelReader::chunks_read() const { return impl_->chunks_read; }

int64_t MelReader::files_per_chunk() const { return impl_->files_per_chunk; }

int64_t MelReader::cache_bytes() const { return impl_->cache_bytes; }

}  // namespace melforge::data
