#pragma once
/// Reads the three splits melforge-build writes (OUT/train.h5, OUT/val.h5, OUT/test.h5; layout in docs/FORMAT.md)
/// after checking the schema version of every file and that the three files agree, and gives their clips as
/// float32 frames: loaded into RAM as one [N, n_mels] tensor (frame-major, clip after clip), or streamed from the
/// file through data::ClipReader (a tuned HDF5 chunk cache) when the dataset does not fit in RAM. Every schema
/// (1, 2 and 3) is read as clips (data::SplitInfo::frame_offset): a schema-1/2 file's clip is its valid short
/// segments side by side. The examples a model sees are cut from the clips by a view (data/views, split_view).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "options.h"
#include "reader/clip_reader.h"
#include "reader/mel_info.h"
#include "reader/split_info.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::trainer {

/// The torch-free parts live in melforge_data (data/reader/): the trainer uses them under their old names.
using data::kSplitNames;
using data::kSupportedSchemaVersion;
using data::MelInfo;
using data::available_memory_bytes;

/// One split: its parameters, class names, clip table and, when loaded, its frames.
struct Split {
  /// Split name: train, val or test.
  std::string name;
  /// The HDF5 file it was read from.
  std::filesystem::path path;
  /// Root attributes.
  MelInfo info;
  /// Class names, indexed by label.
  std::vector<std::string> class_names;
  /// The clip table: frame_offset [F + 1], num_samples [F], clip_flags [F], labels, paths, targets (every schema).
  data::SplitInfo meta;
  /// Every clip's log-mel frames, float32 [N, n_mels] on the CPU, frame-major, clip c at rows
  /// [meta.frame_offset[c], meta.frame_offset[c + 1]); undefined when the split was read without its frames or is
  /// streamed. Every row is a real frame.
  at::Tensor frames;
  /// The reader of a streamed split (its frames stay in the file); null when the frames are in RAM or were not
  /// read. Shared by copies.
  std::shared_ptr<const data::ClipReader> reader;
  /// Class index per clip, int64 [F], each in [0, class_names.size()).
  at::Tensor label;
  /// Path of each clip relative to the corpus root (or as in the manifest), [F].
  std::vector<std::string> paths;
  /// Multi-label targets, float32 [F, num_classes] of 0 and 1 (the file's `targets` matrix); undefined when the
  /// file has none (a single-label corpus).
  at::Tensor targets;

  /// True when the split has a multi-label target matrix.
  bool multilabel() const { return targets.defined(); }
  /// Number of clips (F).
  int64_t files() const { return static_cast<int64_t>(paths.size()); }
  /// Frames of clip `c` (>= 1). Throws InvalidArgument outside [0, files()).
  int64_t clip_frames(int64_t c) const;
  /// Frames of every clip, [F] (the views' input).
  std::vector<int64_t> clip_frame_counts() const;
  /// Frames of the whole split (N = meta.frame_offset.back()).
  int64_t total_frames() const;
  /// True when the frames can be read: loaded in RAM or streamed.
  bool has_frames() const { return frames.defined() || reader != nullptr; }
  /// True when the frames are streamed from the file rather than held in RAM.
  bool streamed() const { return !frames.defined() && reader != nullptr; }
  /// Float32 bytes of the split's frames in RAM (N * n_mels * 4).
  double frame_bytes() const;
  /// Frames of clips [first, first + count), float32 [frames of those clips, n_mels] on the CPU: a view of `frames`
  /// when it is in RAM, a fresh tensor read through `reader` when streamed. Throws InvalidArgument when the range is
  /// outside [0, files()) or the split has no frames, FormatError naming the clip and its path when a value read is
  /// NaN or infinite (ClipReader checks every frame it reads; frames held in RAM were checked when loaded).
  at::Tensor read_clips(int64_t first, int64_t count) const;
  /// The value a padded frame position holds: mel::silence_value(info.mel_args()), as schema 2's empty slots.
  float pad_value() const;
  /// Throws FormatError naming the split, its file, the clip row, the clip's path and the frame and mel band when
  /// `data` (the float32 frames of clips [first, first + count), [frames, n_mels] as read_clips returns them) holds a
  /// NaN or an infinity (for frames that did not come through ClipReader, which checks its own reads).
  void check_finite(int64_t first, int64_t count, const float* data) const;
  /// Reads every frame of a streamed split once through read_clips (so check_finite sees them all); nothing for a
  /// split held in RAM (checked when it was loaded).
  void check_all_finite() const;
};

/// A batch of examples ready for a model.
struct ExampleBatch {
  /// The examples, float32 [B, n_mels, T] (mel-major), each real frames first, then the split's pad value.
  at::Tensor x;
  /// Real frames of each row, int64 [B], each in [1, T].
  at::Tensor lengths;
  /// Clip row (in the split) of each example, int64 [B].
  at::Tensor clip;
};

/// Gathers `examples` of `split` on the CPU (data::views::gather_example): T = `out_length`, or the longest example
/// when 0. Reads each clip involved once (through read_clips when streamed). Throws InvalidArgument when an example
/// is longer than out_length or names a clip outside the split.
ExampleBatch gather_examples(const Split& split, std::span<const data::views::Example> examples,
                             int64_t out_length = 0);

/// The frame rate of `split`'s frames (sample_rate, hop_length).
data::views::FrameRate frame_rate(const MelInfo& info);

/// `options` with what the user left unset resolved for `split` and `model` (ModelOptions::model): the view is
/// tiles of the file's short_seconds for the classification models (today's short segments) and crops of
/// crop_seconds (default 2 s) for the speaker models (`resnet-se`, `ecapa`); a schema-1/2 split is always read as
/// tiles. A field counts as unset when `given` (canonical flag names, e.g. "view", "tile-seconds") is empty and the
/// field equals ViewOptions' default, or when `given` is not empty and does not name its flag.
data::views::ViewOptions resolve_view_options(const data::views::ViewOptions& options, const Split& split,
                                              const std::string& model, const std::set<std::string>& given = {});

/// The view a split is read through: `options` (the --view flags) for a schema-3 split; for schema 1/2 tiles of
/// exactly info.n_frames frames with hop n_frames and min_real 0, which are exactly its stored short segments
/// (another --view, tile length or hop is refused with InvalidArgument naming the flag and the schema). With
/// `evaluation`, min_real is 0 (every frame of every clip is in an example). Validates the options against the
/// split's frame rate.
std::unique_ptr<data::views::View> split_view(const Split& split, const data::views::ViewOptions& options,
                                              bool evaluation);

/// Frames of one example of `options`' view of `split` (the model input width): tiles tile_seconds, crops
/// crop_seconds at the split's frame rate (FrameRate::frames); a schema-1/2 split always info.n_frames. Throws
/// InvalidArgument for the clips view, whose examples have no fixed length.
int64_t example_frames(const data::views::ViewOptions& options, const Split& split);

/// Reads one split file's metadata and checks it on its own (data::read_split_info: schema 1, 2 or 3, the `split`
/// attribute equal to `expected_split`, every attribute and per-clip dataset well formed, checked before any of it
/// is read). With `load_frames` the frames are read into RAM (`frames`, checked finite); otherwise neither
/// `frames` nor `reader` is set. Throws IoError when the file cannot be opened or read, FormatError when it is not
/// a valid melforge dataset of a supported schema.
Split read_split(const std::filesystem::path& path, const std::string& expected_split, bool load_frames = true);
/// read_split without loading the frames, then a ClipReader with a chunk cache of `cache_bytes` attached: the
/// split is streamed.
Split open_split_streamed(const std::filesystem::path& path, const std::string& expected_split, int64_t cache_bytes);
/// read_split with the frames placed by `stream` (`auto`: in RAM when their float32 bytes, N * n_mels * 4, fit
/// `ram_budget_bytes`, -1: MemAvailable; `off` refuses a split that does not fit, naming the sizes, before reading
/// it).
Split load_split(const std::filesystem::path& path, const std::string& expected_split, const StreamOptions& stream,
                 int64_t ram_budget_bytes = -1);

/// A split of the rows `rows` of `sources` ((index into sources, row) pairs, in that order) named `name`, `path`
/// naming it in messages only (no file is read through it): the clip table, labels, paths, targets, folds and groups
/// of those rows (parameters, class names and schema of sources[0]), and their frames copied into RAM, float32
/// [frames of the rows, n_mels] (read through read_clips: from RAM or streamed). melforge-train cv cuts each fold's
/// train, val and test from the pooled splits with it. Throws InvalidArgument for a source index or row out of range.
Split subset_split(const std::vector<const Split*>& sources, const std::vector<std::pair<int, int64_t>>& rows,
                   const std::string& name, const std::filesystem::path& path);

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
  /// Throws FormatError naming the split and the folder when split `name` has no clips.
  void require_files(const std::string& name) const;
  /// Index of class `name` in class_names. Throws InvalidArgument listing the classes when there is none, naming
  /// `flag` (e.g. "--positive-class") as the source of the name.
  int64_t class_index(const std::string& name, const std::string& flag) const;
};

/// Reads and checks `<dir>/{train,val,test}.h5`: each split on its own (read_split), then that the three agree on
/// every parameter and on the class names. Splits may be empty (use Dataset::require_files). Throws IoError when
/// `dir` is not a folder or a file cannot be read, FormatError naming the split and the difference otherwise.
/// With `load_frames`, the float32 frames of the three splits (N * n_mels * 4 bytes each) must fit in
/// `ram_budget_bytes` (-1: the MemAvailable of /proc/meminfo, or no limit where it cannot be read); otherwise Error
/// is thrown, naming the sizes, before anything is loaded (load_dataset with StreamOptions streams such a dataset
/// instead).
Dataset load_dataset(const std::filesystem::path& dir, bool load_frames = true, int64_t ram_budget_bytes = -1);
/// load_dataset with the frames placed by `stream`: `off` as above; `on` streams the three splits; `auto` loads
/// them when they fit in `ram_budget_bytes` (-1: MemAvailable) and streams them otherwise. Every check happens
/// before any frame is read. Frames loaded into RAM are read in blocks of whole clips of about
/// `block_bytes` (at least one clip), and `poll` (when set) is called before each block: it may throw to abandon
/// the load (a stop signal).
Dataset load_dataset(const std::filesystem::path& dir, const StreamOptions& stream, int64_t ram_budget_bytes = -1,
                     const std::function<void()>& poll = {}, int64_t block_bytes = int64_t{64} << 20);

}  // namespace melforge::trainer
