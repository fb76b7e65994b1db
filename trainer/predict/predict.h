#pragma once
/// `melforge-train predict`: classifies raw audio files with a checkpoint. Each file is decoded as a stream and cut
/// into sliding windows of one long segment (kernels/windows) whose spectrograms are computed with the checkpoint's
/// mel parameters exactly as melforge-build computes them; the windows are scored a fixed-size batch at a time and
/// combined per file with the vote of `eval` (kernels/vote).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "inputs/inputs.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::featurize {
class Featurizer;
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
  /// mean or majority (as EvalOptions::vote).
  std::string vote = "mean";
  /// Detection threshold in (0, 1).
  double threshold = 0.5;
  /// CPU threads for decoding and spectrograms (0: all cores).
  int threads = 0;
  /// cpu, cuda or auto.
  std::string device = "auto";
  /// Read entries of input folders whose name starts with '.' (.DS_Store, ._x.wav, .git/); default: ignored.
  bool include_hidden = false;
  /// Seconds between window starts, in (0, long_seconds] of the checkpoint; 0: long_seconds (the builder's layout).
  double hop = 0;
  /// File written with every window's scores (empty: none).
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

/// Registers --checkpoint --format --vote --threshold --threads --device --include-hidden --hop --windows
/// --windows-format --strict and the positional inputs.
void add_options(boost::program_options::options_description& desc, PredictOptions& opts);
/// The positional-argument name add_options uses for the inputs ("input"), for the command-line parser.
inline constexpr const char* kPredictInputsName = "input";

/// The features of one audio file as melforge-build computes them for a dataset with parameters `info`:
/// float32 [num_long, num_short, n_mels, n_frames] (values rounded through float16 when info.dtype is float16,
/// as the builder stores them), and the number of valid long segments. Throws AudioError naming the file when it
/// cannot be decoded or is too short under info.short_files == "skip".
struct FileFeatures {
  at::Tensor mel;
  int64_t num_valid_long = 0;
};
FileFeatures featurize_file(const std::filesystem::path& path, const MelInfo& info, int threads = 0);

/// featurize_file with one spectrogram engine built once for many files (featurize_file builds one per call).
class Featurizer {
 public:
  /// Builds the CPU engine for `info` with `threads` threads (0: all cores). Throws FormatError when `info` holds
  /// parameters the kernels refuse or that do not give its n_frames / num_short.
  explicit Featurizer(const MelInfo& info, int threads = 0);
  ~Featurizer();
  Featurizer(const Featurizer&) = delete;
  Featurizer& operator=(const Featurizer&) = delete;
  /// As featurize_file.
  FileFeatures operator()(const std::filesystem::path& path);
  /// The kernels' featurizer (its engine computes predict's windows).
  featurize::Featurizer& kernel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The inputs predict reads (kernels/inputs, shared with melforge.predict).
using inputs::collect_inputs;
using inputs::PredictInput;

/// Windows of one forward pass: as many as give at most this many short segments (at least one window).
inline constexpr int64_t kPredictBatchSegments = 1024;

/// What run_predict did.
struct PredictSummary {
  /// Input files scored.
  int64_t scored = 0;
  /// Inputs that could not be scored (reported in their row's error column).
  int64_t failed = 0;
};

/// Runs predict: one line (CSV, with a header) or object (JSON array) per input file with its path, predicted
/// class, class probabilities, detection score and decision from the vote over all its windows. Files that cannot
/// be read are reported as such with the reason and counted in `failed` (the other files are still scored); with
/// opts.strict the first one throws AudioError naming it instead, after the rows of the files before it. Throws
/// AudioError when no file could be scored, IoError when the --windows file cannot be written.
PredictSummary run_predict(const PredictOptions& opts, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
