#pragma once
/// `melforge-train predict`: classifies raw audio files with a checkpoint as `eval` scores a dataset's clips. Each
/// file is decoded whole and its log-mel frames computed over the whole clip with the checkpoint's mel parameters
/// (featurize::ClipFeaturizer: MelEngine::compute_clips, as melforge-build stores a schema-3 clip); the frames are cut
/// into the tiles the model was trained on (data/views, min_real 0: every frame of the file, the last tile padded and
/// masked by its length), scored a fixed-size batch at a time, and combined with the clip vote of `eval`
/// (vote::vote_clips). A checkpoint trained on a schema-1/2 dataset reads tiles of its short segment's n_frames.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "inputs/inputs.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::featurize {
class ClipFeaturizer;
}  // namespace melforge::featurize

namespace melforge::data {
struct MelInfo;
}  // namespace melforge::data

namespace melforge::trainer {

using data::MelInfo;

/// `predict` settings.
struct PredictOptions {
  /// The checkpoint to use.
  std::filesystem::path checkpoint;
  /// Audio files, or folders searched recursively for files libsndfile reads (positional arguments).
  std::vector<std::filesystem::path> inputs;
  /// Output format: csv or json.
  std::string format = "csv";
  /// mean or majority over a file's tiles (as EvalOptions::vote; a --task multiclass checkpoint).
  std::string vote = "mean";
  /// A --task multilabel checkpoint: mean or max of a file's tiles' class probabilities; empty: the --aggregate the
  /// run was trained with (its config's eval.aggregate).
  std::string aggregate;
  /// Decision threshold in (0, 1). Multiclass: the detection head's (unset: 0.5). Multilabel: a class is in a file's
  /// label set when its score is >= it (unset: the threshold tuned on val that the checkpoint stores, else 0.5).
  std::optional<double> threshold;
  /// CPU threads for decoding and spectrograms (0: all cores).
  int threads = 0;
  /// cpu, cuda or auto.
  std::string device = "auto";
  /// Read entries of input folders whose name starts with '.' (.DS_Store, ._x.wav, .git/); default: ignored.
  bool include_hidden = false;
  /// Seconds between tile starts, at most the tile; 0: the hop the model was trained with (schema 1/2: the tile).
  double hop = 0;
  /// File written with every tile's scores (empty: none).
  std::filesystem::path windows;
  /// Format of `windows`: csv or json; empty: from its extension (.csv, .json).
  std::string windows_format;
  /// Stop at the first input that cannot be scored (AudioError naming it) instead of reporting it in its row.
  bool strict = false;

  /// The format of the --windows file (windows_format, or the extension); InvalidArgument when neither says.
  std::string resolved_windows_format() const;

  /// Throws InvalidArgument naming the flag (no checkpoint, no input, unknown format, ...).
  void validate() const;
};

/// Registers --checkpoint --format --vote --aggregate --threshold --threads --device --include-hidden --hop --windows
/// --windows-format --strict and the positional inputs.
void add_options(boost::program_options::options_description& desc, PredictOptions& opts);
/// The positional-argument name add_options uses for the inputs ("input"), for the command-line parser.
inline constexpr const char* kPredictInputsName = "input";

/// The log-mel frames of one audio file as a schema-3 dataset built with the parameters `info` stores them: float32
/// [frames, n_mels] (values rounded through float16 when info.dtype is float16). Throws AudioError naming the file
/// when it cannot be decoded, FormatError when `info`'s parameters cannot be used.
at::Tensor featurize_clip(const std::filesystem::path& path, const MelInfo& info, int threads = 0);

/// The tiles predict cuts a file into, in frames: the model's input width (`model_frames`, its config's n_frames;
/// `info.n_frames` when 0) every `hop` frames (the `trained` view's tile hop for a tiles-trained schema-3 model, else
/// the tile; `hop_seconds` > 0 overrides it). Throws InvalidArgument ("--hop ...") when the hop is not finite, is
/// negative, rounds to 0 frames or exceeds the tile.
struct PredictTiles {
  /// Tile length and hop, frames (1 <= hop <= tile).
  int64_t tile = 0;
  int64_t hop = 0;
};
PredictTiles predict_tiles(const MelInfo& info, const nlohmann::json& train_config, int64_t model_frames,
                           double hop_seconds);

/// The inputs predict reads (kernels/inputs, shared with melforge.predict).
using inputs::collect_inputs;
using inputs::PredictInput;

/// Tiles per forward pass.
inline constexpr int64_t kPredictBatchSegments = 1024;

/// What run_predict did.
struct PredictSummary {
  /// Input files scored.
  int64_t scored = 0;
  /// Inputs that could not be scored (reported in their row's error column).
  int64_t failed = 0;
};

/// Runs predict: one line (CSV, with a header) or object (JSON array) per input file with its path, predicted
/// class, class probabilities, detection score and decision from the vote over all its tiles ("num_windows": the
/// tiles); for a --task multilabel checkpoint its label set, each class's sigmoid score (mean or max over the tiles)
/// and the threshold applied (trainer/README.md, "Predicting"). Files that cannot
/// be read are reported as such with the reason and counted in `failed` (the other files are still scored); with
/// opts.strict the first one throws AudioError naming it instead, after the rows of the files before it. Throws
/// AudioError when no file could be scored, IoError when the --windows file cannot be written.
PredictSummary run_predict(const PredictOptions& opts, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
