#pragma once
/// Option groups of melforge-train's subcommands. Each has in-class defaults, validate() and add_options(), so that
/// every subcommand spells a flag the same way.
#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// Whether the spectrograms are held in RAM or streamed from the HDF5 files.
struct StreamOptions {
  /// `off`: load every split into RAM (refused when it does not fit); `on`: stream every split; `auto`: RAM when
  /// the three splits fit in the available memory, streaming otherwise.
  std::string stream = "auto";
  /// HDF5 chunk cache per streamed split, MiB (>= 1).
  int64_t h5_cache = 64;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
  /// Every field, keyed by field name.
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults); throws FormatError on a mistyped one.
  static StreamOptions from_json(const nlohmann::json& j);
};

/// Registers --stream --h5-cache.
void add_options(boost::program_options::options_description& desc, StreamOptions& opts);

/// Where the dataset is, and how its spectrograms are held.
struct DataOptions {
  /// A melforge-build output folder holding train.h5, val.h5 and test.h5.
  std::filesystem::path data;
  /// RAM or streaming.
  StreamOptions stream;

  /// Throws InvalidArgument when `data` is empty or `stream` is invalid.
  void validate() const;
};

/// Registers --data and the StreamOptions flags.
void add_options(boost::program_options::options_description& desc, DataOptions& opts);

/// Which model, and its widths.
struct ModelOptions {
  /// Architecture: `cnn`, `crnn` (conv front end, then a recurrent layer over time), the speaker embedding models
  /// `resnet-se` (ResNetSE34-style, models/resnet_se.h) and `ecapa` (ECAPA-TDNN, models/ecapa.h), or `auto` (the
  /// default): resnet-se for `--task verification`, cnn for every other task (resolved()).
  std::string model = "auto";
  /// `crnn` only: the recurrent layer, `gru` or `lstm`.
  std::string rnn = "gru";
  /// `crnn` only: hidden size of the recurrent layer.
  int64_t rnn_hidden = 64;
  /// Width of the hidden fully connected layer.
  int64_t hidden = 128;
  /// Dropout probability before the heads, in [0, 1).
  double dropout = 0.3;
  /// Seed of the parameter initialisation.
  uint64_t seed = 42;
  /// `resnet-se` and `ecapa`: width of the speaker embedding (>= 1).
  int64_t embedding_dim = 192;
  /// `resnet-se` only: `half` (filters 32, 64, 128, 256) or `quarter` (16, 32, 64, 128).
  std::string width = "half";
  /// `ecapa` only: channels of the SE-Res2Net blocks, a positive multiple of 8.
  int64_t channels = 512;
  /// Per-utterance cepstral mean normalisation inside the model's forward (Classifier::set_cmn): `on`, `off` or
  /// `auto` (the default: on for the speaker models resnet-se and ecapa, off for cnn and crnn; resolved()). A
  /// configuration read from JSON without the field (a run from before it) reads `off`.
  std::string cmn = "auto";

  /// Throws InvalidArgument for an unknown model, an out-of-range width or a --cmn other than auto, on or off.
  void validate() const;
  /// These options with `auto` resolved for `task` (`verification`, `multiclass`, ...): model auto is resnet-se for
  /// verification and cnn otherwise; cmn auto is on for resnet-se and ecapa, off for cnn and crnn.
  ModelOptions resolved(const std::string& task) const;
  /// Whether resolved(task) normalises each utterance's mel bins by their mean (cmn `on`).
  bool cmn_on(const std::string& task) const { return resolved(task).cmn == "on"; }
};

/// Registers --model --rnn --rnn-hidden --hidden --dropout --seed --embedding-dim --width --channels --cmn.
void add_options(boost::program_options::options_description& desc, ModelOptions& opts);

/// ModelOptions as JSON (every field) and back (missing fields keep their defaults, except a missing "cmn", which
/// reads `off` as every run before the field was trained; FormatError on a mistyped one).
nlohmann::json to_json(const ModelOptions& opts);
ModelOptions model_options_from_json(const nlohmann::json& j);

/// Where and how a command computes, and how much it says.
struct RuntimeOptions {
  /// `auto` (CUDA when a device is available, else the CPU), `cpu` or `cuda`.
  std::string device = "auto";
  /// CPU threads of LibTorch's intra-op pool; 0 keeps LibTorch's default (all cores).
  int threads = 0;
  /// `debug`, `info`, `warn` or `error`; empty: the environment variable MELFORGE_LOG_LEVEL, else `info`.
  std::string log_level;

  /// Throws InvalidArgument for an unknown device or log level, or negative threads. Does not look for a GPU.
  void validate() const;
  /// The device to use. Throws InvalidArgument when `cuda` is asked for and no CUDA device is available.
  c10::Device resolve_device() const;
  /// Applies `threads` (at::set_num_threads) when it is > 0, capped at max_threads() (common/parallel.h) with a
  /// one-line warning on stderr when it is more.
  void apply_threads() const;
};

/// Tunes glibc's allocator for LibTorch's pattern of large, short-lived tensors, unless the environment already sets
/// it (any MALLOC_*_ variable, or MELFORGE_MALLOC=default to keep glibc's defaults). By default glibc serves
/// allocations above a threshold with mmap and returns them to the kernel when freed, and trims the heap's free top,
/// so every training step or evaluation pass maps its activations afresh and the kernel zeroes each page again
/// (measured: 1.19M page faults in a 100-step `bench`, 12 % of the step in the kernel). After this call no
/// allocation uses mmap (M_MMAP_MAX 0) and the heap keeps its free memory (M_TRIM_THRESHOLD 2 GiB), so freed
/// memory is reused: peak RSS stays about the same, and memory is not returned to the kernel before the process
/// ends. Returns true when it changed the settings. Call it once, first thing in main.
bool configure_allocator();

/// Registers --device --threads --log-level.
void add_options(boost::program_options::options_description& desc, RuntimeOptions& opts);

/// Message severities, in increasing order.
enum class LogLevel { debug, info, warn, error };

/// Parses debug|info|warn|error; throws InvalidArgument naming `source` (a flag or variable) otherwise.
LogLevel parse_log_level(const std::string& s, const std::string& source);

/// Plain log lines ("[melforge-train] info: ...") on a stream, below a level dropped.
class Logger {
 public:
  /// Logs to `out` at `level` (messages below it are dropped).
  explicit Logger(std::ostream& out, LogLevel level = LogLevel::info) : out_(&out), level_(level) {}
  /// From RuntimeOptions::log_level, or MELFORGE_LOG_LEVEL when that is empty, or `info`.
  static Logger from(std::ostream& out, const RuntimeOptions& opts);
  /// Whether messages of `level` are printed.
  bool enabled(LogLevel level) const { return level >= level_; }
  /// The level.
  LogLevel level() const { return level_; }
  void debug(const std::string& msg) const { write(LogLevel::debug, msg); }
  void info(const std::string& msg) const { write(LogLevel::info, msg); }
  void warn(const std::string& msg) const { write(LogLevel::warn, msg); }
  void error(const std::string& msg) const { write(LogLevel::error, msg); }
  /// The stream.
  std::ostream& stream() const { return *out_; }

 private:
  void write(LogLevel level, const std::string& msg) const;
  std::ostream* out_;
  LogLevel level_;
};

}  // namespace melforge::trainer
