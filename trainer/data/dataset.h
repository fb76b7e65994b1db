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

#include "options.h"
#include "reader/mel_info.h"
#include "reader/mel_reader.h"
#include "reader/split_info.h"

namespace melforge::trainer {

/// The torch-free parts live in melforge_data (data/reader/): the trainer uses them under their old names.
using data::kSplitNames;
using data::kSupportedSchemaVersion;
using data::MelInfo;
using data::MelReader;
using data::available_memory_bytes;

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
  /// Multi-label targets, float32 [files, num_classes] of 0 and 1 (the file's `targets` matrix); undefined when
  /// the file has none (a single-label corpus).
  at::Tensor targets;

  /// True when the split has a multi-label target matrix.
  bool multilabel() const { return targets.defined(); }
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
  /// True when the three splits carry multi-label targets (checked to agree by load_dataset).
  bool multilabel() const { return train.multilabel(); }
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

}  // namespace melforge::trainer
