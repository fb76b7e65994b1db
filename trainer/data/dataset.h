#pragma once
/// Reads the three splits melforge-build writes (OUT/train.h5, OUT/val.h5, OUT/test.h5; layout in docs/FORMAT.md)
/// after checking the schema version of every file and that the three files agree, and gives their spectrograms
/// as float32 tensors: loaded into RAM, or streamed from the file through a tuned HDF5 chunk cache when the
/// dataset does not fit in RAM.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mel/mel_args.h"
#include "options.h"
#include "segment/segment_args.h"

namespace melforge::trainer {

/// The dataset schema version this reader understands (docs/FORMAT.md, "Schema versioning").
inline constexpr int64_t kSupportedSchemaVersion = 1;

/// Split names in order (0 train, 1 val, 2 test); split `s` is stored in `<dir>/<s>.h5`.
inline const std::vector<std::string> kSplitNames = {"train", "val", "test"};

/// The parameters that produced a split: the root attributes of docs/FORMAT.md, named as there.
struct MelInfo {
  /// Sample rate of the analysed audio, Hz.
  int64_t sample_rate = 0;
  /// FFT size, samples.
  int64_t n_fft = 0;
  /// Effective window length, samples.
  int64_t win_length = 0;
  /// Effective hop, samples.
  int64_t hop_length = 0;
  /// `hann` or `hamming`.
  std::string window;
  /// 1: frames centred (segment padded by n_fft/2 on both sides); 0: not.
  int64_t center = 0;
  /// `reflect` or `constant`.
  std::string pad_mode;
  /// Exponent of the magnitude spectrogram.
  double power = 0;
  /// Mel bands (M).
  int64_t n_mels = 0;
  /// Lowest filter edge, Hz.
  double f_min = 0;
  /// Effective highest filter edge, Hz.
  double f_max = 0;
  /// `htk` or `slaney`.
  std::string mel_scale;
  /// `none` or `slaney`.
  std::string mel_norm;
  /// `db`, `ln` or `none`.
  std::string log;
  /// Floor for `log db`.
  double amin = 0;
  /// Offset for `log ln`.
  double log_eps = 0;
  /// Stored element type of `mel`: `float16` or `float32`.
  std::string dtype;
  /// Long segment length, seconds.
  double long_seconds = 0;
  /// Short segment length, seconds.
  double short_seconds = 0;
  /// Long segment length, samples at sample_rate.
  int64_t long_samples = 0;
  /// Short segment length, samples at sample_rate.
  int64_t short_samples = 0;
  /// Long segments per file (L).
  int64_t num_long = 0;
  /// Short segments per long segment (S).
  int64_t num_short = 0;
  /// Frames per short segment (T).
  int64_t n_frames = 0;
  /// `pad` or `skip`.
  std::string short_files;
  /// Input channel used, -1 for a mix to mono (-1 when the file has no `channel` attribute).
  int64_t channel = -1;
  /// Version of melforge that wrote the file (informational: not compared between splits).
  std::string melforge_version;

  /// Shape of one file's spectrograms: [num_long, num_short, n_mels, n_frames].
  std::vector<int64_t> file_shape() const { return {num_long, num_short, n_mels, n_frames}; }
  /// The spectrogram parameters as the kernels take them (enums parsed). Throws FormatError on an unknown spelling.
  mel::MelArgs mel_args() const;
  /// The segmentation parameters (num_long fixed to this dataset's). Throws FormatError on an unknown spelling.
  segment::SegmentArgs segment_args() const;
  /// Every parameter above as a JSON object keyed by attribute name (for configs and checkpoints).
  nlohmann::json to_json() const;
  /// The inverse of to_json(). Throws FormatError naming the first missing or mistyped field.
  static MelInfo from_json(const nlohmann::json& j);
  /// "NAME is A in THIS but B in OTHER" for the first parameter that differs from `other` (melforge_version
  /// excluded), with `this_name` and `other_name` naming the two sides; empty when every parameter is equal.
  std::string first_difference(const MelInfo& other, const std::string& this_name,
                               const std::string& other_name) const;
};

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
  /// Files per HDF5 chunk along dim 0 (1 for a contiguous dataset): reads aligned to it inflate each chunk once.
  int64_t files_per_chunk() const;
  /// The chunk cache size in use, bytes.
  int64_t cache_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One split: its parameters, class names and, when loaded, its data.
struct Split {
  /// Split name: train, val or test.
  std::string name;
  /// The HDF5 file it was read from.
  std::filesystem::path path;
  /// Root attributes.
  MelInfo info;
  /// Class names, indexed by label.
  std::vector<std::string> class_names;
  /// Spectrograms, float32 on the CPU, [files, num_long, num_short, n_mels, n_frames]; undefined when the split
  /// was read without its data or is streamed. Long segments l >= num_valid_long[f] hold the silence value.
  at::Tensor mel;
  /// The reader of a streamed split (its spectrograms stay in the file); null otherwise. Shared by copies.
  std::shared_ptr<const MelReader> reader;
  /// Class index per file, int64 [files], each in [0, class_names.size()).
  at::Tensor label;
  /// Long segments that hold audio per file, int64 [files], each in [1, num_long].
  at::Tensor num_valid_long;
  /// Path of each file relative to the corpus root (or as in the manifest), [files].
  std::vector<std::string> paths;

  /// Number of files (dim 0 of `mel`).
  int64_t files() const { return static_cast<int64_t>(paths.size()); }
  /// Short segments that hold audio: sum over files of num_valid_long * num_short.
  int64_t valid_segments() const;
  /// True when the spectrograms can be read: loaded in RAM or streamed.
  bool has_mel() const { return mel.defined() || reader != nullptr; }
  /// True when the spectrograms are streamed from the file rather than held in RAM.
  bool streamed() const { return !mel.defined() && reader != nullptr; }
  /// Files per HDF5 chunk of a streamed split (the unit its readers should align to); 1 when held in RAM.
  int64_t files_per_chunk() const { return streamed() ? reader->files_per_chunk() : 1; }
  /// Spectrograms of files [first, first + count), float32 on the CPU, [count, num_long, num_short, n_mels,
  /// n_frames]: a view of `mel` when it is in RAM, a fresh tensor read through `reader` when streamed. Throws
  /// InvalidArgument when the range is outside [0, files()) or the split has no spectrograms.
  at::Tensor read_files(int64_t first, int64_t count) const;
  /// Throws FormatError naming the split, its file, the row, the audio file's path and the position when `data`
  /// (the float32 spectrograms of files [first, first + count), laid out as read_files returns them) holds a NaN or
  /// an infinity. Every reader of spectrograms calls it on what it read.
  void check_finite(int64_t first, int64_t count, const float* data) const;
  /// Reads every spectrogram of a streamed split once through read_files (so check_finite sees them all); nothing
  /// for a split held in RAM (checked when it was loaded).
  void check_all_finite() const;
};


/// Reads one split file and checks it on its own: schema version, the `split` attribute equal to `expected_split`,
/// every parameter attribute present and well formed, `mel` of shape [F, num_long, num_short, n_mels, n_frames],
/// `label`, `num_valid_long` and `path` of length F, labels within the class names, num_valid_long in
/// [1, num_long], and F small enough that the per-file metadata (about 64 bytes a file) fits in MemAvailable,
/// checked before any of it is read. With `load_mel` false the spectrograms are not read (`mel` stays undefined).
/// Throws IoError when the file cannot be opened or read, FormatError when it is not a valid melforge dataset of a
/// supported schema.
Split read_split(const std::filesystem::path& path, const std::string& expected_split, bool load_mel = true);
/// read_split without loading the spectrograms, then a MelReader with a chunk cache of `cache_bytes` attached:
/// the split is streamed.
Split open_split_streamed(const std::filesystem::path& path, const std::string& expected_split, int64_t cache_bytes);
/// read_split with the spectrograms placed by `stream` (`auto`: in RAM when they fit `ram_budget_bytes`, -1:
/// MemAvailable; `off` refuses a split that does not fit, naming the sizes, before reading it).
Split load_split(const std::filesystem::path& path, const std::string& expected_split, const StreamOptions& stream,
                 int64_t ram_budget_bytes = -1);

/// The three splits of a melforge-build output folder, checked to agree with each other.
struct Dataset {
  /// The folder.
  std::filesystem::path dir;
  /// Parameters, equal in the three splits (taken from train.h5).
  MelInfo info;
  /// Class names, equal in the three splits.
  std::vector<std::string> class_names;
  /// train.h5.
  Split train;
  /// val.h5.
  Split val;
  /// test.h5.
  Split test;

  /// Number of classes.
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }
  /// The split called `name` (train, val or test). Throws InvalidArgument for another name.
  const Split& split(const std::string& name) const;
  /// Throws FormatError naming the split and the folder when split `name` has no files.
  void require_files(const std::string& name) const;
  /// Index of class `name` in class_names. Throws InvalidArgument listing the classes when there is none, naming
  /// `flag` (e.g. "--positive-class") as the source of the name.
  int64_t class_index(const std::string& name, const std::string& flag) const;
};

/// Reads and checks `<dir>/{train,val,test}.h5`: each split on its own (read_split), then that the three agree on
/// every parameter and on the class names. Splits may be empty (use Dataset::require_files). Throws IoError when
/// `dir` is not a folder or a file cannot be read, FormatError naming the split and the difference otherwise.
/// With `load_mel`, the float32 spectrograms of the three splits must fit in `ram_budget_bytes` (-1: the
/// MemAvailable of /proc/meminfo, or no limit where it cannot be read); otherwise Error is thrown, naming the
/// sizes, before anything is loaded (load_dataset with StreamOptions streams such a dataset instead).
Dataset load_dataset(const std::filesystem::path& dir, bool load_mel = true, int64_t ram_budget_bytes = -1);
/// load_dataset with the spectrograms placed by `stream`: `off` as above; `on` streams the three splits; `auto`
/// loads them when they fit in `ram_budget_bytes` (-1: MemAvailable) and streams them otherwise. Every check
/// happens before any spectrogram is read. Spectrograms loaded into RAM are read in blocks of whole chunks of about
/// `block_bytes` (at least one chunk), and `poll` (when set) is called before each block: it may throw to abandon
/// the load (a stop signal).
Dataset load_dataset(const std::filesystem::path& dir, const StreamOptions& stream, int64_t ram_budget_bytes = -1,
                     const std::function<void()>& poll = {}, int64_t block_bytes = int64_t{64} << 20);

/// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

}  // namespace melforge::trainer
