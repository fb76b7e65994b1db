#include "h5_writer.h"

#include <libdeflate.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <system_error>

#include "clip_plan.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "melforge/common/parallel.h"
#include "melforge/common/timing.h"
#include "melforge/common/utf8.h"

namespace melforge::builder {

namespace {

constexpr int64_t kAutoChunkBytes = int64_t{1} << 20;
constexpr auto kMaxChunkBytes = static_cast<int64_t>(h5::kMaxWrittenChunkBytes);

/// HDF5's H5Z_shuffle (forward): byte j of element i goes to dst[j * n + i]; trailing bytes that do not form an
/// element are copied as they are; nothing changes for 1-byte elements or a single element.
void shuffle_bytes(const unsigned char* src, unsigned char* dst, size_t nbytes, size_t elem) {
  const size_t n = nbytes / elem;
  if (elem <= 1 || n <= 1) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (elem == 2) {
    unsigned char* d0 = dst;
    unsigned char* d1 = dst + n;
    for (size_t i = 0; i < n; ++i) {
      d0[i] = src[2 * i];
      d1[i] = src[2 * i + 1];
    }
  } else if (elem == 4) {
    unsigned char* d0 = dst;
    unsigned char* d1 = dst + n;
    unsigned char* d2 = dst + 2 * n;
    unsigned char* d3 = dst + 3 * n;
    for (size_t i = 0; i < n; ++i) {
      d0[i] = src[4 * i];
      d1[i] = src[4 * i + 1];
      d2[i] = src[4 * i + 2];
      d3[i] = src[4 * i + 3];
    }
  } else {
    for (size_t j = 0; j < elem; ++j) {
      for (size_t i = 0; i < n; ++i) dst[j * n + i] = src[i * elem + j];
    }
  }
  std::memcpy(dst + n * elem, src + n * elem, nbytes - n * elem);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

/// `names` with the bytes that are not valid UTF-8 escaped (utf8::escape), as the string datasets store them.
std::vector<std::string> escaped(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const auto& n : names) out.push_back(utf8::escape(n));
  return out;
}

/// Writes the 1-D dataset `name` of `count` elements of `mem_type` at `data`, stored as `file_type`, without object
/// times (byte-identical files).
void write_column(h5::File& file, const std::string& name, hid_t file_type, hid_t mem_type, std::size_t count,
                  const void* data) {
  h5::silence_errors();
  const std::string what = file.name() + ":/" + name;
  const hsize_t dims[1] = {count};
  const hid_t space_id = H5Screate_simple(1, dims, nullptr);
  if (space_id < 0) h5::throw_io(what + ": cannot create a dataspace");
  const h5::Dataspace space(space_id, what);
  const hid_t plist_id = H5Pcreate(H5P_DATASET_CREATE);
  if (plist_id < 0) h5::throw_io(what + ": cannot create a property list");
  const h5::PropList dcpl(plist_id, what);
  if (H5Pset_obj_track_times(dcpl.id(), false) < 0) h5::throw_io(what + ": cannot turn off time tracking");
  const hid_t id = H5Dcreate2(file.id(), name.c_str(), file_type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT);
  if (id < 0) h5::throw_io(what + ": cannot create the dataset");
  h5::Dataset ds(id, what);
  if (count > 0 && H5Dwrite(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    h5::throw_io(what + ": cannot write");
  ds.close();
}

/// Reads the 1-D dataset `name` of `file` (named `where`), which must hold `count` elements, as `mem_type`.
template <class T>
std::vector<T> read_column(h5::File& file, const std::string& name, hid_t mem_type, int64_t count,
                           const std::string& where) {
  if (!h5::exists(file, name)) throw FormatError(where + ": dataset '" + name + "' is missing (schema 3)");
  const h5::Dataset ds = h5::open_dataset(file, name);
  const std::vector<int64_t> d = h5::dims(ds);
  if (d.size() != 1 || d[0] != count)
    throw FormatError(where + ": " + name + " has shape " + shape_string(d) + ", expected [" + std::to_string(count) +
                      "]");
  std::vector<T> out(static_cast<std::size_t>(count));
  h5::read_rows(ds, 0, count, mem_type, out.data());
  return out;
}

}  // namespace

std::string identity_hash(const std::vector<std::string>& parts) {
  uint64_t h[2] = {0xCBF29CE484222325ULL, 0x84222325CBF29CE4ULL};
  for (uint64_t& x : h) {
    for (const std::string& part : parts) {
      for (const unsigned char c : part) x = (x ^ c) * 0x100000001B3ULL;
      x = (x ^ 0xFFu) * 0x100000001B3ULL;
    }
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h[0]),
                static_cast<unsigned long long>(h[1]));
  return buf;
}

int64_t chunk_frames(int64_t frame_bytes, int64_t frames_per_chunk) {
  return frames_per_chunk > 0 ? frames_per_chunk : std::max<int64_t>(1, kAutoChunkBytes / frame_bytes);
}

struct ChunkCompressor::Impl {
  int level = 0;
  bool shuffled = false;
  int64_t elem_bytes = 0;
  int threads = 1;
  std::string where;
  std::vector<std::vector<unsigned char>> outputs;
  std::vector<size_t> output_sizes;
  std::vector<std::vector<unsigned char>> scratch;
  /// One libdeflate compressor per worker thread, made on first use at the configured level.
  std::vector<std::unique_ptr<libdeflate_compressor, decltype(&libdeflate_free_compressor)>> compressors;

  void compress(const unsigned char* const* sources, int64_t count, size_t chunk) {
    if (outputs.size() < static_cast<size_t>(count)) outputs.resize(static_cast<size_t>(count));
    output_sizes.assign(static_cast<size_t>(count), 0);
    const int workers = static_cast<int>(std::min<int64_t>(threads, count));
    if (shuffled && scratch.size() < static_cast<size_t>(workers)) scratch.resize(static_cast<size_t>(workers));
    while (compressors.size() < static_cast<size_t>(workers)) {
      libdeflate_compressor* c = libdeflate_alloc_compressor(level);
      if (c == nullptr) throw IoError(where + ": cannot allocate a deflate compressor");
      compressors.emplace_back(c, &libdeflate_free_compressor);
    }
    parallel_ranges(count, workers, [&](int t, int64_t begin, int64_t end) {
      libdeflate_compressor* compressor = compressors[static_cast<size_t>(t)].get();
      const size_t bound = libdeflate_zlib_compress_bound(compressor, chunk);
      for (int64_t i = begin; i < end; ++i) {
        const unsigned char* src = sources[i];
        if (shuffled) {
          std::vector<unsigned char>& tmp = scratch[static_cast<size_t>(t)];
          tmp.resize(chunk);
          shuffle_bytes(src, tmp.data(), chunk, static_cast<size_t>(elem_bytes));
          src = tmp.data();
        }
        std::vector<unsigned char>& out = outputs[static_cast<size_t>(i)];
        out.resize(bound);
        const size_t out_size = libdeflate_zlib_compress(compressor, src, chunk, out.data(), out.size());
        if (out_size == 0) throw IoError(where + ": deflate of a chunk failed");
        output_sizes[static_cast<size_t>(i)] = out_size;
      }
    });
  }
};

ChunkCompressor::ChunkCompressor(int level, bool shuffle, int64_t elem_bytes, int threads, std::string where)
    : impl_(std::make_unique<Impl>()) {
  impl_->level = level;
  impl_->shuffled = shuffle;
  impl_->elem_bytes = elem_bytes;
  impl_->threads = std::max(1, threads);
  impl_->where = std::move(where);
}

ChunkCompressor::~ChunkCompressor() = default;

void ChunkCompressor::compress(const unsigned char* const* sources, int64_t count, size_t chunk_bytes) {
  impl_->compress(sources, count, chunk_bytes);
}

const unsigned char* ChunkCompressor::output(int64_t i) const { return impl_->outputs[static_cast<size_t>(i)].data(); }

size_t ChunkCompressor::output_size(int64_t i) const { return impl_->output_sizes[static_cast<size_t>(i)]; }

struct SplitWriter::Impl {
  enum class State { open, finished, failed };

  SplitWriterConfig config;
  std::filesystem::path partial_path;
  State state = State::open;
  h5::File file;
  h5::Dataset frames_ds;
  int64_t elem_bytes = 0;
  int64_t frame_bytes = 0;
  int64_t frames_per_chunk = 0;
  int64_t chunk_bytes = 0;
  int threads = 1;
  bool filtered = false;
  bool shuffled = false;

  std::unique_ptr<ChunkCutter> cutter;
  int64_t chunks_written = 0;
  int64_t files = 0;
  int64_t frames = 0;
  std::vector<int32_t> labels;
  std::vector<std::string> paths;
  ClipColumns clips;
  std::vector<int32_t> source_sample_rate;
  std::vector<uint8_t> targets;
  RecipeColumns recipes;
  std::vector<int32_t> folds;
  std::vector<std::string> groups;
  std::vector<float> speed_speakers;

  /// Shuffle + deflate of whole chunks; null when compression_level is 0.
  std::unique_ptr<ChunkCompressor> compressor;

  double compress_s = 0;
  double write_s = 0;
  int64_t bytes = 0;

  explicit Impl(SplitWriterConfig c) : config(std::move(c)) {
    validate();
    partial_path = config.final_path;
    partial_path += ".partial";
    elem_bytes = config.dtype == mel::DType::float16 ? 2 : 4;
    frame_bytes = elem_bytes * config.n_mels;
    frames_per_chunk = chunk_frames(frame_bytes, config.frames_per_chunk);
    chunk_bytes = frames_per_chunk * frame_bytes;
    if (chunk_bytes > kMaxChunkBytes) {
      throw InvalidArgument("HDF5 writer: frames_per_chunk " + std::to_string(frames_per_chunk) +
                            " gives chunks of " + std::to_string(chunk_bytes) + " bytes, more than " +
                            std::to_string(kMaxChunkBytes >> 20) + " MiB");
    }
    threads = resolve_threads(config.threads);
    filtered = config.compression_level > 0;
    shuffled = filtered && config.shuffle;
    if (filtered) {
      compressor = std::make_unique<ChunkCompressor>(config.compression_level, shuffled, elem_bytes, threads,
                                                     partial_path.string());
    }
    create();
  }

  void validate() const {
    const std::string where = "HDF5 writer for " + config.final_path.string();
    if (config.final_path.empty()) throw InvalidArgument("HDF5 writer: final_path is empty");
    if (config.n_mels < 1) throw InvalidArgument(where + ": n_mels must be >= 1, got " + std::to_string(config.n_mels));
    if (config.compression_level < 0 || config.compression_level > 9) {
      throw InvalidArgument(where + ": compression level must be 0..9, got " +
                            std::to_string(config.compression_level));
    }
    if (config.frames_per_chunk < 0) throw InvalidArgument(where + ": frames_per_chunk must be >= 0");
    if (config.threads < 0) throw InvalidArgument(where + ": threads must be >= 0");
    std::set<std::string> names = {"schema_version", "split", "melforge_version"};
    for (const Attribute& a : config.attributes) {
      if (!names.insert(a.name).second) {
        throw InvalidArgument(where + ": attribute '" + a.name + "' is given twice or is reserved");
      }
    }
  }

  void create() {
    std::error_code ec;
    std::filesystem::remove(partial_path, ec);
    const Stopwatch watch;
    try {
      file = h5::create_file(partial_path);
      frames_ds = create_frames_dataset(file, config.n_mels, config.dtype, frames_per_chunk, shuffled,
                                        config.compression_level);
    } catch (...) {
      fail();
      throw;
    }
    write_s += watch.seconds();
    cutter = std::make_unique<ChunkCutter>(frames_per_chunk, frame_bytes);
  }

  void fail() noexcept {
    frames_ds.reset();
    file.reset();
    std::error_code ec;
    std::filesystem::remove(partial_path, ec);
    state = State::failed;
  }

  void require_open() const {
    if (state == State::failed) {
      throw IoError(partial_path.string() + ": an earlier write failed; the writer cannot continue");
    }
    if (state == State::finished) throw InvalidArgument(config.final_path.string() + ": the writer is finished");
  }

  void validate_records(const std::vector<FileRecord>& records) const {
    const auto num_classes = static_cast<int64_t>(config.class_names.size());
    for (const FileRecord& r : records) {
      if (num_classes > 0 && (r.label < 0 || r.label >= num_classes)) {
        throw InvalidArgument(config.final_path.string() + ": label " + std::to_string(r.label) + " of '" + r.path +
                              "' is outside [0, " + std::to_string(num_classes) + ")");
      }
      for (const int32_t t : r.targets)
        if (t < 0 || t >= num_classes)
          throw InvalidArgument(config.final_path.string() + ": target " + std::to_string(t) + " of '" + r.path +
                                "' is outside [0, " + std::to_string(num_classes) + ")");
      if (config.folds && (r.fold < 1 || r.fold > kMaxFolds))
        throw InvalidArgument(config.final_path.string() + ": fold " + std::to_string(r.fold) + " of '" + r.path +
                              "' is outside [1, " + std::to_string(kMaxFolds) + "]");
      if (r.frames < 1 || r.num_samples < 0 || (r.clip_flags & ~(kStoredPadded | kStoredCapped)) != 0) {
        throw InvalidArgument(config.final_path.string() + ": clip '" + r.path + "' has " + std::to_string(r.frames) +
                              " frames, " + std::to_string(r.num_samples) + " samples and flags " +
                              std::to_string(r.clip_flags) + " (needs >= 1 frame, >= 0 samples, flags 0..3)");
      }
    }
  }

  /// Shuffles and deflates `sources` (whole chunks) in parallel batches and writes them in order.
  void compress_and_write(const std::vector<const unsigned char*>& sources) {
    const auto total = static_cast<int64_t>(sources.size());
    const int64_t batch = std::max<int64_t>(1, int64_t{threads} * kChunksPerThreadPerBatch);
    const auto chunk = static_cast<size_t>(chunk_bytes);
    for (int64_t first = 0; first < total; first += batch) {
      const int64_t count = std::min(batch, total - first);
      if (filtered) compress_batch(sources.data() + first, count);
      const Stopwatch watch;
      for (int64_t i = 0; i < count; ++i) {
        std::vector<int64_t> offset = {chunks_written * frames_per_chunk, 0};
        const void* data = filtered ? static_cast<const void*>(compressor->output(i))
                                    : static_cast<const void*>(sources[static_cast<size_t>(first + i)]);
        const size_t size = filtered ? compressor->output_size(i) : chunk;
        h5::write_chunk(frames_ds, offset, data, size, 0);
        ++chunks_written;
        bytes += static_cast<int64_t>(size);
      }
      write_s += watch.seconds();
    }
  }

  void compress_batch(const unsigned char* const* sources, int64_t count) {
    const Stopwatch watch;
    compressor->compress(sources, count, static_cast<size_t>(chunk_bytes));
    compress_s += watch.seconds();
  }

  void extend(int64_t new_frames) {
    const Stopwatch watch;
    h5::set_extent(frames_ds, {new_frames, config.n_mels});
    write_s += watch.seconds();
  }

  void append(const void* data, const std::vector<FileRecord>& records) {
    require_open();
    validate_records(records);
    const auto n = static_cast<int64_t>(records.size());
    if (n == 0) return;
    if (data == nullptr) throw InvalidArgument(config.final_path.string() + ": append() got no frames");
    int64_t batch_frames = 0;
    for (const FileRecord& r : records) batch_frames += r.frames;
    try {
      const std::vector<const unsigned char*> sources =
          cutter->append(static_cast<const unsigned char*>(data), batch_frames);
      extend(frames + batch_frames);
      compress_and_write(sources);
    } catch (...) {
      fail();
      throw;
    }
    files += n;
    frames += batch_frames;
    for (const FileRecord& r : records) {
      labels.push_back(r.label);
      paths.push_back(r.path);
      clips.push(r.frames, r.num_samples, r.clip_flags);
      source_sample_rate.push_back(r.source_sample_rate);
      if (config.multilabel) add_target_row(r);
      if (config.augmented) recipes.push(r.recipe);
      if (config.folds) folds.push_back(r.fold);
      if (config.groups) groups.push_back(r.group);
      if (config.speed_speakers) speed_speakers.push_back(r.speed_speaker);
    }
  }

  void add_target_row(const FileRecord& r) {
    const std::size_t row = targets.size();
    targets.resize(row + config.class_names.size(), 0);
    targets[row + static_cast<std::size_t>(r.label)] = 1;
    for (const int32_t t : r.targets) targets[row + static_cast<std::size_t>(t)] = 1;
  }

  void write_metadata() {
    write_split_metadata(file, config.split, config.class_names, config.attributes, labels, paths, clips,
                         config.source_sample_rate ? &source_sample_rate : nullptr,
                         config.multilabel ? &targets : nullptr);
    if (config.augmented) write_recipe_columns(file, recipes);
    write_fold_group(file, config.folds ? &folds : nullptr, config.groups ? &groups : nullptr);
    if (config.speed_speakers) h5::write_float32(file, kSpeedSpeakerDataset, speed_speakers);
  }

  void finish() {
    require_open();
    try {
      if (const unsigned char* last = cutter->flush()) compress_and_write({last});
      const Stopwatch watch;
      write_metadata();
      h5::silence_errors();
      if (H5Fflush(file.id(), H5F_SCOPE_GLOBAL) < 0) h5::throw_io(file.name() + ": cannot flush");
      frames_ds.close();
      file.close();
      write_s += watch.seconds();
      std::error_code ec;
      std::filesystem::rename(partial_path, config.final_path, ec);
      if (ec) {
        throw IoError("cannot rename " + partial_path.string() + " to " + config.final_path.string() + ": " +
                      ec.message());
      }
    } catch (...) {
      fail();
      throw;
    }
    state = State::finished;
  }
};

SplitWriter::SplitWriter(SplitWriterConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

SplitWriter::~SplitWriter() {
  if (impl_ && impl_->state == Impl::State::open) impl_->fail();
}

void write_split_metadata(h5::File& file, const std::string& split, const std::vector<std::string>& class_names,
                          const std::vector<Attribute>& attributes, const std::vector<int32_t>& labels,
                          const std::vector<std::string>& paths, const ClipColumns& clips,
                          const std::vector<int32_t>* source_sample_rate, const std::vector<uint8_t>* targets) {
  if (clips.size() != labels.size() || paths.size() != labels.size())
    throw InvalidArgument("write_split_metadata: " + std::to_string(labels.size()) + " labels, " +
                          std::to_string(paths.size()) + " paths and " + std::to_string(clips.size()) + " clips");
  h5::write_int32(file, "label", labels);
  h5::write_strings(file, "path", escaped(paths));
  write_clip_columns(file, clips);
  if (source_sample_rate != nullptr) {
    if (source_sample_rate->size() != labels.size())
      throw InvalidArgument("write_split_metadata: " + std::to_string(source_sample_rate->size()) +
                            " source sample rates for " + std::to_string(labels.size()) + " files");
    h5::write_int32(file, "source_sample_rate", *source_sample_rate);
  }
  if (targets != nullptr)
    h5::write_uint8_matrix(file, "targets", static_cast<int64_t>(labels.size()),
                           static_cast<int64_t>(class_names.size()), *targets);
  h5::write_strings(file, "class_names", escaped(class_names));
  h5::write_attribute_int64(file, "schema_version", kSchemaVersion);
  h5::write_attribute_string(file, "split", split);
  h5::write_attribute_string(file, "melforge_version", MELFORGE_VERSION);
  for (const Attribute& a : attributes) h5::write_attribute(file, a.name, a.value);
}

void write_fold_group(h5::File& file, const std::vector<int32_t>* folds, const std::vector<std::string>* groups) {
  if (folds != nullptr) h5::write_int32(file, "fold", *folds);
  if (groups != nullptr) h5::write_strings(file, "group", escaped(*groups));
}

void RecipeColumns::push(const RowRecipe& r) {
  copy.push_back(r.copy);
  speed.push_back(r.speed);
  rir.push_back(r.rir);
  noise.push_back(r.noise);
  snr_db.push_back(r.snr_db);
  gain_db.push_back(r.gain_db);
}

RowRecipe RecipeColumns::row(std::size_t i) const {
  return {copy.at(i), speed.at(i), rir.at(i), noise.at(i), snr_db.at(i), gain_db.at(i)};
}

void write_recipe_columns(h5::File& file, const RecipeColumns& c) {
  h5::write_int32(file, "aug_copy", c.copy);
  h5::write_float32(file, "aug_speed", c.speed);
  h5::write_strings(file, "aug_rir", escaped(c.rir));
  h5::write_strings(file, "aug_noise", escaped(c.noise));
  h5::write_float32(file, "aug_snr_db", c.snr_db);
  h5::write_float32(file, "aug_gain_db", c.gain_db);
}

bool read_recipe_columns(h5::File& file, std::size_t rows, const std::string& where, RecipeColumns& out) {
  std::size_t present = 0;
  for (const auto& name : kRecipeDatasets) present += h5::exists(file, name) ? 1 : 0;
  out = {};
  if (present == 0) return false;
  if (present != kRecipeDatasets.size())
    throw FormatError(where + ": holds only some of the aug_* recipe datasets (" + std::to_string(present) + " of " +
                      std::to_string(kRecipeDatasets.size()) + ")");
  out.copy = h5::read_int32(file, "aug_copy");
  out.speed = h5::read_float(h5::open_dataset(file, "aug_speed"));
  out.rir = h5::read_strings(file, "aug_rir");
  out.noise = h5::read_strings(file, "aug_noise");
  out.snr_db = h5::read_float(h5::open_dataset(file, "aug_snr_db"));
  out.gain_db = h5::read_float(h5::open_dataset(file, "aug_gain_db"));
  for (const std::size_t n : {out.copy.size(), out.speed.size(), out.rir.size(), out.noise.size(), out.snr_db.size(),
                              out.gain_db.size()})
    if (n != rows)
      throw FormatError(where + ": an aug_* recipe dataset has " + std::to_string(n) + " entries for " +
                        std::to_string(rows) + " rows");
  return true;
}

h5::Dataset create_frames_dataset(h5::File& file, int64_t n_mels, mel::DType dtype, int64_t frames_per_chunk,
                                  bool shuffle, int level) {
  h5::Datatype f16;
  hid_t type = H5T_NATIVE_FLOAT;
  if (dtype == mel::DType::float16) {
    f16 = h5::float16_type();
    type = f16.id();
  }
  h5::ChunkedSpec spec;
  spec.dims = {0, n_mels};
  spec.max_dims = {-1, n_mels};
  spec.chunk = {frames_per_chunk, n_mels};
  spec.shuffle = level > 0 && shuffle;
  spec.deflate_level = level;
  return h5::create_chunked_dataset(file, "frames", type, spec);
}

void ClipColumns::push(int64_t frames, int64_t samples, uint8_t flags) {
  frame_offset.push_back(frame_offset.back() + frames);
  num_samples.push_back(samples);
  clip_flags.push_back(flags);
}

void ClipColumns::append(const ClipColumns& other) {
  const int64_t base = total_frames();
  for (std::size_t i = 1; i < other.frame_offset.size(); ++i) frame_offset.push_back(base + other.frame_offset[i]);
  num_samples.insert(num_samples.end(), other.num_samples.begin(), other.num_samples.end());
  clip_flags.insert(clip_flags.end(), other.clip_flags.begin(), other.clip_flags.end());
}

void write_clip_columns(h5::File& file, const ClipColumns& c) {
  write_column(file, "frame_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, c.frame_offset.size(), c.frame_offset.data());
  write_column(file, "num_samples", H5T_STD_I64LE, H5T_NATIVE_INT64, c.num_samples.size(), c.num_samples.data());
  write_column(file, "clip_flags", H5T_STD_U8LE, H5T_NATIVE_UINT8, c.clip_flags.size(), c.clip_flags.data());
}

ClipColumns read_clip_columns(h5::File& file, int64_t clips, int64_t frames, const std::string& where) {
  ClipColumns c;
  c.frame_offset = read_column<int64_t>(file, "frame_offset", H5T_NATIVE_INT64, clips + 1, where);
  c.num_samples = read_column<int64_t>(file, "num_samples", H5T_NATIVE_INT64, clips, where);
  c.clip_flags = read_column<uint8_t>(file, "clip_flags", H5T_NATIVE_UINT8, clips, where);
  if (c.frame_offset.front() != 0 || c.frame_offset.back() != frames)
    throw FormatError(where + ": frame_offset runs from " + std::to_string(c.frame_offset.front()) + " to " +
                      std::to_string(c.frame_offset.back()) + ", not from 0 to the " + std::to_string(frames) +
                      " rows of frames");
  for (int64_t f = 0; f < clips; ++f) {
    const auto i = static_cast<std::size_t>(f);
    if (c.frame_offset[i + 1] <= c.frame_offset[i])
      throw FormatError(where + ": frame_offset is not strictly increasing at clip " + std::to_string(f));
    if (c.num_samples[i] < 0) throw FormatError(where + ": num_samples of clip " + std::to_string(f) + " is negative");
    if ((c.clip_flags[i] & ~(kStoredPadded | kStoredCapped)) != 0)
      throw FormatError(where + ": clip_flags of clip " + std::to_string(f) + " is " +
                        std::to_string(c.clip_flags[i]) + ", not a combination of bits 1 and 2");
  }
  return c;
}

ChunkCutter::ChunkCutter(int64_t units_per_chunk, int64_t unit_bytes)
    : units_per_chunk_(units_per_chunk), unit_bytes_(unit_bytes) {
  if (units_per_chunk < 1 || unit_bytes < 1)
    throw InvalidArgument("ChunkCutter: units per chunk and bytes per unit must be >= 1");
}

std::vector<const unsigned char*> ChunkCutter::append(const unsigned char* src, int64_t n) {
  std::vector<const unsigned char*> chunks;
  if (n <= 0) return chunks;
  if (pending_ > 0) {
    const int64_t k = std::min(units_per_chunk_ - pending_, n);
    std::memcpy(buffers_[current_].data() + pending_ * unit_bytes_, src, static_cast<size_t>(k * unit_bytes_));
    pending_ += k;
    src += k * unit_bytes_;
    n -= k;
    if (pending_ == units_per_chunk_) {
      chunks.push_back(buffers_[current_].data());
      current_ ^= 1;
      pending_ = 0;
    }
  }
  for (; n >= units_per_chunk_; n -= units_per_chunk_, src += units_per_chunk_ * unit_bytes_) chunks.push_back(src);
  if (n > 0) {
    if (buffers_[current_].empty()) buffers_[current_].resize(static_cast<size_t>(units_per_chunk_ * unit_bytes_));
    std::memcpy(buffers_[current_].data(), src, static_cast<size_t>(n * unit_bytes_));
    pending_ = n;
  }
  return chunks;
}

const unsigned char* ChunkCutter::flush() {
  if (pending_ == 0) return nullptr;
  std::vector<unsigned char>& b = buffers_[current_];
  std::memset(b.data() + pending_ * unit_bytes_, 0, b.size() - static_cast<size_t>(pending_ * unit_bytes_));
  current_ ^= 1;
  pending_ = 0;
  return b.data();
}

void SplitWriter::append(const void* mel, const std::vector<FileRecord>& records) { impl_->append(mel, records); }

void SplitWriter::finish() { impl_->finish(); }

int64_t SplitWriter::files() const { return impl_->files; }

int64_t SplitWriter::frames() const { return impl_->frames; }

double SplitWriter::compress_seconds() const { return impl_->compress_s; }

double SplitWriter::write_seconds() const { return impl_->write_s; }

int64_t SplitWriter::bytes_written() const { return impl_->bytes; }

int64_t SplitWriter::chunks_written() const { return impl_->chunks_written; }

}  // namespace melforge::builder
