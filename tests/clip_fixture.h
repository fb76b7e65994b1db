#pragma once
// Schema-3 split files (clips stored whole, issue 28) written by the tests themselves through melforge::h5 and the
// raw HDF5 API, with known values, and the committed schema-1/2 datasets of tests/data/legacy
// (tools/gen_legacy_fixtures.py).
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "mel/half.h"
#include "melforge_test_paths.h"

namespace melforge::test {

/// The committed schema-`schema` dataset folder (1 or 2) of tests/data/legacy.
inline std::filesystem::path legacy_dataset(int schema) {
  return std::filesystem::path(MELFORGE_TEST_DATA_DIR) / "legacy" / ("v" + std::to_string(schema));
}

/// What write_clip_split writes.
struct ClipSplitSpec {
  /// Frames of each clip (>= 1 for a valid file).
  std::vector<int64_t> clip_frames;
  /// Mel bands (M).
  int64_t n_mels = 5;
  /// float16 (true) or float32 `frames`.
  bool half = false;
  /// Rows of `frames` per HDF5 chunk.
  int64_t chunk_rows = 4;
  /// Classes; clip c gets label c % classes.
  int64_t classes = 3;
  /// Split name (the `split` attribute).
  std::string split = "train";
};

/// A written split: the expected float32 frames [N][M] (float16 values as stored), and the clip table.
struct ClipSplitData {
  std::vector<float> frames;
  std::vector<int64_t> frame_offset;
  std::vector<int64_t> num_samples;
  std::vector<uint8_t> clip_flags;
  std::vector<int32_t> labels;
  std::vector<std::string> paths;
};

/// Writes the 1-D integer dataset `name` of file type `type` (contiguous) from int64 `values`.
inline void write_int_dataset(const h5::File& file, const std::string& name, hid_t type,
                              const std::vector<int64_t>& values) {
  const auto n = static_cast<hsize_t>(values.size());
  h5::Dataspace space(H5Screate_simple(1, &n, nullptr), "space");
  h5::Dataset d(H5Dcreate2(file.id(), name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
  if (!d || (n > 0 && H5Dwrite(d.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0))
    throw IoError("cannot write " + name);
}

/// Replaces dataset `name` of the split file at `path` by the 1-D integer dataset `values` of type `type`.
inline void replace_int_dataset(const std::filesystem::path& path, const std::string& name, hid_t type,
                                const std::vector<int64_t>& values) {
  auto f = h5::open_file(path, true);
  if (H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) < 0) throw IoError("cannot delete " + name);
  write_int_dataset(f, name, type, values);
}

/// Replaces dataset `name` of the file at `path` by an unwritten chunked dataset of type `type` and extent `dims`
/// (claims any size, stores nothing).
inline void replace_by_empty_claim(const std::filesystem::path& path, const std::string& name, hid_t type,
                                   const std::vector<int64_t>& dims) {
  auto f = h5::open_file(path, true);
  if (h5::exists(f, name) && H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) < 0) throw IoError("cannot delete " + name);
  h5::ChunkedSpec spec;
  spec.dims = dims;
  spec.chunk.assign(dims.size(), 1);
  spec.chunk.back() = std::min<int64_t>(dims.back(), 64);
  h5::create_chunked_dataset(f, name, type, spec);
}

/// The root attributes of a schema-3 split of `n_mels` mels at 16 kHz with hop 160 (tile 0.08 s = 8 frames).
inline void write_clip_attributes(const h5::File& f, const ClipSplitSpec& spec) {
  h5::write_attribute_int64(f, "schema_version", 3);
  h5::write_attribute_string(f, "split", spec.split);
  h5::write_attribute_string(f, "melforge_version", "test");
  for (const auto& [k, v] : std::vector<std::pair<std::string, int64_t>>{
           {"sample_rate", 16000}, {"n_fft", 400}, {"win_length", 400}, {"hop_length", 160}, {"center", 1},
           {"n_mels", spec.n_mels}, {"short_samples", 1280}, {"n_frames", 8}, {"channel", -1}})
    h5::write_attribute_int64(f, k, v);
  for (const auto& [k, v] : std::vector<std::pair<std::string, double>>{
           {"power", 2.0}, {"f_min", 0.0}, {"f_max", 8000.0}, {"amin", 1e-10}, {"log_eps", 1e-6},
           {"short_seconds", 0.08}, {"max_seconds", 0.0}})
    h5::write_attribute_double(f, k, v);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"window", "hann"}, {"pad_mode", "reflect"}, {"mel_scale", "htk"}, {"mel_norm", "none"}, {"log", "db"},
           {"dtype", spec.half ? "float16" : "float32"}})
    h5::write_attribute_string(f, k, v);
}

/// Writes a valid schema-3 split file at `path` (chunked, shuffled and deflated `frames` as the builder writes it)
/// with seeded random values, clip c labelled c % classes, num_samples = 160 * frames - 80, clip_flags cycling
/// through 0..3. Returns what it wrote.
inline ClipSplitData write_clip_split(const std::filesystem::path& path, const ClipSplitSpec& spec) {
  ClipSplitData d;
  d.frame_offset.push_back(0);
  for (std::size_t c = 0; c < spec.clip_frames.size(); ++c) {
    d.frame_offset.push_back(d.frame_offset.back() + spec.clip_frames[c]);
    d.num_samples.push_back(std::max<int64_t>(1, 160 * spec.clip_frames[c] - 80));
    d.clip_flags.push_back(static_cast<uint8_t>(c % 4));
    d.labels.push_back(static_cast<int32_t>(static_cast<int64_t>(c) % spec.classes));
    d.paths.push_back("clips/" + std::to_string(c) + ".wav");
  }
  const int64_t n = d.frame_offset.back();
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + spec.n_mels));
  std::uniform_real_distribution<float> value(-100.0f, 0.0f);
  std::vector<uint16_t> halves;
  for (int64_t i = 0; i < n * spec.n_mels; ++i) {
    const float v = value(rng);
    halves.push_back(mel::float_to_half_bits(v));
    d.frames.push_back(spec.half ? mel::half_bits_to_float(halves.back()) : v);
  }
  auto f = h5::create_file(path);
  write_clip_attributes(f, spec);
  h5::ChunkedSpec cs;
  cs.dims = {n, spec.n_mels};
  cs.max_dims = {-1, spec.n_mels};
  cs.chunk = {spec.chunk_rows, spec.n_mels};
  cs.shuffle = true;
  cs.deflate_level = 1;
  const h5::Datatype f16 = h5::float16_type();
  auto frames = h5::create_chunked_dataset(f, "frames", spec.half ? f16.id() : H5T_IEEE_F32LE, cs);
  if (n > 0 && H5Dwrite(frames.id(), spec.half ? f16.id() : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        spec.half ? static_cast<const void*>(halves.data()) : d.frames.data()) < 0)
    throw IoError("cannot write frames");
  write_int_dataset(f, "frame_offset", H5T_STD_I64LE, d.frame_offset);
  write_int_dataset(f, "num_samples", H5T_STD_I64LE, d.num_samples);
  write_int_dataset(f, "clip_flags", H5T_STD_U8LE, {d.clip_flags.begin(), d.clip_flags.end()});
  h5::write_int32(f, "label", d.labels);
  h5::write_strings(f, "path", d.paths);
  std::vector<std::string> classes;
  for (int64_t c = 0; c < spec.classes; ++c) classes.push_back("class" + std::to_string(c));
  h5::write_strings(f, "class_names", classes);
  return d;
}

}  // namespace melforge::test
