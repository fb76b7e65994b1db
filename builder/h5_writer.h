#pragma once
/// Writes one split's HDF5 file: parallel-compressed chunks written with HDF5's direct chunk write.
#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "mel/mel_args.h"
#include "melforge/common/h5.h"

namespace melforge::builder {

/// A root attribute: integer, floating point or UTF-8 string.
struct Attribute {
  /// Attribute name (e.g. "n_fft").
  std::string name;
  /// Value; int64 is stored as H5T_NATIVE_INT64, double as H5T_NATIVE_DOUBLE, strings as variable-length UTF-8.
  h5::AttributeValue value;
};

/// The recipe of one row as the aug_* datasets store it (docs/FORMAT.md, "Waveform augmentation").
struct RowRecipe {
  /// `aug_copy`: 0 for the clean copy, k >= 1 for augmented copy k.
  int32_t copy = 0;
  /// `aug_speed`: speed factor (1: none).
  float speed = 1.0f;
  /// `aug_rir`: impulse response, path relative to --rir ('/'-separated); empty: none.
  std::string rir;
  /// `aug_noise`: noise clip, path relative to --noise; empty: none.
  std::string noise;
  /// `aug_snr_db`: SNR of the noise, dB; NaN without noise.
  float snr_db = std::numeric_limits<float>::quiet_NaN();
  /// `aug_gain_db`: gain, dB (0: none).
  float gain_db = 0.0f;
};

/// The aug_* datasets of a split file, one entry per row (parallel vectors).
struct RecipeColumns {
  /// aug_copy.
  std::vector<int32_t> copy;
  /// aug_speed.
  std::vector<float> speed;
  /// aug_rir.
  std::vector<std::string> rir;
  /// aug_noise.
  std::vector<std::string> noise;
  /// aug_snr_db.
  std::vector<float> snr_db;
  /// aug_gain_db.
  std::vector<float> gain_db;
  /// Appends one row.
  void push(const RowRecipe& r);
  /// Row `i` (< size()).
  RowRecipe row(std::size_t i) const;
  /// Rows held.
  std::size_t size() const { return copy.size(); }
};

/// Names of the per-row recipe datasets, in the order written.
inline const std::vector<std::string> kRecipeDatasets = {"aug_copy", "aug_speed", "aug_rir", "aug_noise",
                                                         "aug_snr_db", "aug_gain_db"};

/// Writes the aug_* datasets of `columns` into `file` (int32, float32 and variable-length UTF-8 strings, 1-D).
void write_recipe_columns(h5::File& file, const RecipeColumns& columns);

/// Reads the aug_* datasets of `file` (named `where` in messages) into `out`; returns false, leaving `out` empty,
/// when the file has none of them (a build without --augment-copies). Throws FormatError when only some exist or
/// one does not hold `rows` entries.
bool read_recipe_columns(h5::File& file, std::size_t rows, const std::string& where, RecipeColumns& out);

/// The per-clip layout datasets of a schema-3 split file (docs/FORMAT.md): where each clip's frames are, its samples
/// and its flags.
struct ClipColumns {
  /// frame_offset [F + 1]: clip f is rows [frame_offset[f], frame_offset[f + 1]) of `frames`; starts at 0.
  std::vector<int64_t> frame_offset{0};
  /// num_samples [F]: samples of the stored clip at the `sample_rate` attribute.
  std::vector<int64_t> num_samples;
  /// clip_flags [F]: StoredClipFlag bits (1: padded to one frame, 2: cut at --max-seconds).
  std::vector<uint8_t> clip_flags;
  /// Appends one clip of `frames` (>= 1) frames.
  void push(int64_t frames, int64_t samples, uint8_t flags);
  /// Appends every clip of `other`, its frame offsets rebased after this one's last frame.
  void append(const ClipColumns& other);
  /// Clips held.
  std::size_t size() const { return num_samples.size(); }
  /// Frames of all clips (frame_offset.back()).
  int64_t total_frames() const { return frame_offset.back(); }
};

/// Writes the frame_offset (int64), num_samples (int64) and clip_flags (uint8) datasets of `columns` into `file`.
void write_clip_columns(h5::File& file, const ClipColumns& columns);

/// Reads and checks the clip layout datasets of `file` (named `where` in messages) for `frames` rows of `frames`:
/// frame_offset of `clips` + 1 entries starting at 0, strictly increasing, ending at `frames`; num_samples (>= 0)
/// and clip_flags (bits 0 and 1 only) of `clips` entries. Throws FormatError naming the file and the dataset.
ClipColumns read_clip_columns(h5::File& file, int64_t clips, int64_t frames, const std::string& where);

/// Per-row metadata stored beside the frames.
struct FileRecord {
  /// Class index into class_names.
  int32_t label = 0;
  /// Path relative to the input root, or as written in the manifest (UTF-8).
  std::string path;
  /// Frames of the clip (>= 1): rows of `frames` it takes.
  int64_t frames = 0;
  /// Samples of the stored clip at the target rate (num_samples).
  int64_t num_samples = 0;
  /// StoredClipFlag bits (clip_flags).
  uint8_t clip_flags = 0;
  /// The audio file's own sample rate, Hz, before resampling to the `sample_rate` attribute (0: unknown, in files
  /// merged from shards that did not record it).
  int32_t source_sample_rate = 0;
  /// Class indices of every label of a multi-label file (`label` among them); empty: the file has `label` alone.
  /// Used only when SplitWriterConfig::multilabel.
  std::vector<int32_t> targets;
  /// The row's recipe (--augment-copies). Used only when SplitWriterConfig::augmented.
  RowRecipe recipe;
  /// The file's fold 1..K (`fold`). Used only when SplitWriterConfig::folds.
  int32_t fold = 0;
  /// The file's group key (`group`; "" none). Used only when SplitWriterConfig::groups.
  std::string group;
  /// `speed_speaker`: the --speed-speakers factor of the row's speaker, 1 for a row of the file's own speaker. Used
  /// only when SplitWriterConfig::speed_speakers.
  float speed_speaker = 1.0f;
};

/// Everything the writer needs up front.
struct SplitWriterConfig {
  /// Final path, e.g. OUT/train.h5. The file is written as `<final_path>.partial` and renamed by finish().
  std::filesystem::path final_path;
  /// Split name stored in the `split` attribute.
  std::string split;
  /// Mel bands: the width M of one frame, a row of `frames` [N, M].
  int64_t n_mels = 0;
  /// Stored element type of `frames`.
  mel::DType dtype = mel::DType::float16;
  /// Deflate level 1..9, or 0 for no compression (the chunks are then stored raw).
  int compression_level = 4;
  /// Apply HDF5's shuffle filter before deflate.
  bool shuffle = true;
  /// Frames per HDF5 chunk; 0 picks chunk_frames' default (about 1 MiB uncompressed).
  int64_t frames_per_chunk = 0;
  /// Threads that compress chunks (0: all cores).
  int threads = 0;
  /// Class names, indexed by label; written as `class_names`.
  std::vector<std::string> class_names;
  /// Root attributes (schema_version, split and melforge_version are added by the writer).
  std::vector<Attribute> attributes;
  /// Write the `source_sample_rate` dataset (FileRecord::source_sample_rate); false only when merging shards that
  /// did not record it.
  bool source_sample_rate = true;
  /// Write the `targets` matrix [files, classes] (uint8, 1 where the file carries the class): a multi-label corpus.
  bool multilabel = false;
  /// Write the aug_* datasets (FileRecord::recipe; write_recipe_columns): a build with --augment-copies > 0.
  bool augmented = false;
  /// Write the `fold` dataset (FileRecord::fold, each in 1..kMaxFolds): a build whose files have folds (the `folds`
  /// root attribute comes with `attributes`).
  bool folds = false;
  /// Write the `group` dataset (FileRecord::group): a build whose files have groups.
  bool groups = false;
  /// Write the `speed_speaker` dataset (float32 [F], FileRecord::speed_speaker): a build with --speed-speakers.
  bool speed_speakers = false;
};

/// Name of the per-row dataset of a build with --speed-speakers: the speaker's speed factor (1: an ordinary row).
inline constexpr const char* kSpeedSpeakerDataset = "speed_speaker";

/// Largest fold count a dataset may declare (the `folds` attribute; readers check K in [2, kMaxFolds]).
inline constexpr int32_t kMaxFolds = 1000;

/// Writes the `fold` (H5T_STD_I32LE [F]) and `group` (variable-length UTF-8 [F], bytes that are not UTF-8 escaped)
/// datasets into `file`; a null pointer leaves that dataset out.
void write_fold_group(h5::File& file, const std::vector<int32_t>* folds, const std::vector<std::string>* groups);

/// Schema version written to every file's `schema_version` attribute: 3, whole clips (docs/FORMAT.md).
inline constexpr int64_t kSchemaVersion = 3;

/// Name of the root attribute that identifies one build (or merge): the same value in every split file it
/// writes and in its build_report.json, so that readers refuse splits of different builds side by side.
inline constexpr const char* kBuildIdAttribute = "build_id";

/// A build identifier made from `parts` (every text that determines the build): two 64-bit FNV-1a hashes of them
/// (with different offset bases, each part followed by a separator byte) as 32 lower-case hex digits. Not a
/// cryptographic hash: it tells builds apart, it does not authenticate them. Identical parts give the identical
/// identifier, so that identical inputs and parameters still give byte-identical files.
std::string identity_hash(const std::vector<std::string>& parts);

/// Frames per HDF5 chunk that SplitWriter uses for frames of `frame_bytes` bytes each: `frames_per_chunk` when > 0,
/// else as many as fit in 1 MiB (at least 1). SplitWriter refuses chunks over h5::kMaxWrittenChunkBytes
/// (256 MiB; readers refuse chunks over h5::kMaxChunkBytes). Exposed for melforge-build
/// bench, so that it cuts chunks exactly as a build does.
int64_t chunk_frames(int64_t frame_bytes, int64_t frames_per_chunk);

/// Creates the empty, extensible `frames` dataset of a split file as SplitWriter does: [0, n_mels] of float16 or
/// float32, dim 0 unlimited, chunks of `frames_per_chunk` whole frames, with the shuffle filter when `shuffle` and
/// deflate at `level` (0: no filters).
h5::Dataset create_frames_dataset(h5::File& file, int64_t n_mels, mel::DType dtype, int64_t frames_per_chunk,
                                  bool shuffle, int level);

/// Writes the metadata of a split file into `file`: the parallel datasets `label`, `path` and `source_sample_rate`
/// (one entry per clip, in dataset order; `source_sample_rate` is left out when the pointer is null), the clip
/// layout (write_clip_columns), `targets` (uint8 [clips, class_names.size()], row-major; left out when the pointer is
/// null: a single-label corpus), `class_names`, and the root attributes schema_version, `split`, melforge_version and
/// then `attributes`. Paths and class names are stored as UTF-8 strings, bytes that are not valid UTF-8 escaped by
/// utf8::escape (`\xNN`). SplitWriter::finish and melforge-build merge call it.
void write_split_metadata(h5::File& file, const std::string& split, const std::vector<std::string>& class_names,
                          const std::vector<Attribute>& attributes, const std::vector<int32_t>& labels,
                          const std::vector<std::string>& paths, const ClipColumns& clips,
                          const std::vector<int32_t>* source_sample_rate,
                          const std::vector<uint8_t>* targets = nullptr);

/// Cuts a stream of units (frames), `unit_bytes` bytes each, into whole chunks of `units_per_chunk` units, as
/// SplitWriter stores them. Units of a chunk that is not yet full are copied and kept until the next call.
class ChunkCutter {
 public:
  /// `units_per_chunk` >= 1 units of `unit_bytes` >= 1 bytes per chunk. Its two chunk buffers are allocated when units
  /// are first kept, so a writer whose chunks all lie whole inside the batches holds none.
  ChunkCutter(int64_t units_per_chunk, int64_t unit_bytes);
  /// Appends the `n` units at `src` and returns the chunks that are now complete, in order: the kept chunk when these
  /// units fill it, then the whole chunks inside `src`. The pointers stay valid until the next append() or flush(),
  /// and those into `src` as long as `src` does.
  std::vector<const unsigned char*> append(const unsigned char* src, int64_t n);
  /// The kept chunk, zero-padded after its units, or nullptr when no units are kept; valid until the next call.
  const unsigned char* flush();
  /// Units kept for the next chunk.
  int64_t pending_units() const { return pending_; }

 private:
  int64_t units_per_chunk_;
  int64_t unit_bytes_;
  std::array<std::vector<unsigned char>, 2> buffers_;
  int current_ = 0;
  int64_t pending_ = 0;
};

/// Whole chunks SplitWriter compresses per worker thread before it writes them (one compress-then-write round).
inline constexpr int kChunksPerThreadPerBatch = 4;

/// The compressor of SplitWriter: each chunk goes through HDF5's shuffle filter (when enabled) and then zlib-wrapped
/// deflate (libdeflate) at the configured level, which is what HDF5's deflate filter decodes. Chunks are compressed
/// in parallel, one libdeflate compressor per worker thread, made on first use. SplitWriter compresses every chunk
/// through this class; melforge-build bench uses it to time compression alone.
class ChunkCompressor {
 public:
  /// `level` 1..9; `shuffle`: apply the shuffle filter to elements of `elem_bytes` bytes; up to `threads` (>= 1)
  /// workers; `where` names the output file in error messages.
  ChunkCompressor(int level, bool shuffle, int64_t elem_bytes, int threads, std::string where);
  ~ChunkCompressor();
  ChunkCompressor(const ChunkCompressor&) = delete;
  ChunkCompressor& operator=(const ChunkCompressor&) = delete;

  /// Compresses `count` chunks of `chunk_bytes` bytes each (chunk i starts at sources[i]) on min(threads, count)
  /// threads. The results stay valid until the next call. Throws IoError when deflate fails.
  void compress(const unsigned char* const* sources, int64_t count, size_t chunk_bytes);
  /// Compressed bytes of chunk `i` of the last compress() call.
  const unsigned char* output(int64_t i) const;
  /// Size in bytes of output(i).
  size_t output_size(int64_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

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

  /// Appends `records.size()` clips. `frames` holds the sum of records[i].frames frames, clip after clip, each
  /// [n_mels] elements of the configured dtype. Whole chunks are shuffled and deflated in parallel and written with
  /// H5Dwrite_chunk; a partial trailing chunk is kept until more frames arrive or finish(). Throws InvalidArgument for
  /// a record with no frame, negative samples, unknown flags or a label outside the classes; IoError on a write
  /// failure (e.g. a full disk).
  void append(const void* frames, const std::vector<FileRecord>& records);
  /// Writes the remaining chunk, `label`, `path`, the clip layout, `class_names` and the attributes, closes the file,
  /// and renames it to final_path. Throws IoError on failure (the partial file is removed).
  void finish();
  /// Clips appended so far.
  int64_t files() const;
  /// Frames appended so far.
  int64_t frames() const;
  /// Seconds spent compressing (summed wall time of the parallel compress phases).
  double compress_seconds() const;
  /// Seconds spent in HDF5 calls that write.
  double write_seconds() const;
  /// Compressed bytes of `frames` written so far.
  int64_t bytes_written() const;
  /// Chunks of `frames` written so far (a split's last chunk, zero-padded, is written by finish()).
  int64_t chunks_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace melforge::builder
