#pragma once
/// `melforge-train train`, `eval` and `bench`: the training loop over a melforge-build dataset, the run folder it
/// writes, the evaluation of a checkpoint, and the benchmark of each stage on its own.
///
/// A run folder RUN holds config.json (the full configuration, mel parameters and classes), metrics.jsonl (one
/// line per epoch), checkpoints/last.pt and checkpoints/best.pt (written atomically after every epoch), and at the
/// end report.json (best.pt evaluated on val and test), confusion_val.csv, confusion_test.csv and timings.json;
/// trace.json with --profile-steps.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/loader.h"
#include "dist/dist.h"
#include "eval/evaluate.h"
#include "options.h"
#include "train/optim.h"
#include "train/spec_augment.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

struct Checkpoint;
struct Dataset;
struct MelInfo;

/// The settings of `train` that are neither model, optimizer, loader, augmentation nor evaluation settings.
struct TrainOptions {
  /// The run folder to create (must be empty or absent, unless `overwrite`).
  std::filesystem::path out;
  /// A run to continue: its folder, or a checkpoint inside it (normally RUN/checkpoints/last.pt).
  std::filesystem::path resume;
  /// Write into a non-empty run folder, replacing the files a run writes (other files are left alone).
  bool overwrite = false;
  /// Epochs to train (the cosine schedule spans all of them), >= 1.
  int64_t epochs = 30;
  /// Mixed precision: `off`, `fp16` (CUDA only, with a GradScaler) or `bf16` (CPU or CUDA).
  std::string amp = "off";
  /// Class the detection head detects. Empty: the class named `leak` when there is one, else the first class.
  std::string positive_class;
  /// Weight of the detection head's BCE in the loss, >= 0.
  double bce_weight = 1.0;
  /// Weight of the positive term of the BCE: `auto` (negatives / positives among the training segments) or a
  /// positive number.
  std::string pos_weight = "auto";
  /// Stop after this many epochs without improvement of best_metric; 0 never stops early.
  int64_t patience = 10;
  /// The metric that picks best.pt and drives early stopping: val_macro_f1, val_accuracy, val_loss (lower is
  /// better) or val_file_accuracy.
  std::string best_metric = "val_macro_f1";
  /// CUDA only: capture forward, backward and optimizer step in a CUDA Graph (implies drop-last; not with fp16).
  bool cuda_graph = false;
  /// CUDA only: channels-last memory format for the convolutions.
  bool channels_last = false;
  /// Profile this many training steps of the first epoch into RUN/trace.json (Chrome trace); 0: off.
  int64_t profile_steps = 0;

  /// Throws InvalidArgument naming the flag for a value out of range (device-independent checks only).
  void validate() const;
  /// The fields that define the run (not out/resume/overwrite/profile_steps).
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults); FormatError on a mistyped one.
  static TrainOptions from_json(const nlohmann::json& j);
};

/// Registers --out --resume --overwrite --epochs --amp --positive-class --bce-weight --pos-weight --patience
/// --best-metric --cuda-graph --channels-last --profile-steps.
void add_options(boost::program_options::options_description& desc, TrainOptions& opts);

/// Everything `train` is configured by.
struct TrainConfig {
  DataOptions data;
  ModelOptions model;
  OptimOptions optim;
  LoaderOptions loader;
  SpecAugmentOptions augment;
  EvalOptions eval;
  TrainOptions train;
  RuntimeOptions runtime;
  /// Data-parallel job (not saved in config.json; a checkpoint records the world size).
  DistOptions dist;

  /// Validates every group (before any data is read). --data and --out are required unless --resume is given.
  void validate() const;
  /// {"data", "model", "optim", "loader", "augment", "eval", "train"}: what the run folder's config.json and the
  /// checkpoints record (the runtime group is not part of it: it does not change the result on the CPU).
  nlohmann::json to_json() const;
  /// The inverse of to_json() (runtime left at its defaults). Throws FormatError on a malformed document.
  static TrainConfig from_json(const nlohmann::json& j);
};

/// Registers every group of TrainConfig.
void add_options(boost::program_options::options_description& desc, TrainConfig& config);

/// Optional callbacks into the loop, for tests and instrumentation.
struct TrainHooks {
  /// Called with each training batch after it is delivered and before the forward pass; may modify it.
  std::function<void(int64_t epoch, Batch& batch)> on_batch;
  /// Called after epoch `epoch` (0-based) is checkpointed; returning false stops the run there, as if it had been
  /// killed (the run can be resumed; no final report).
  std::function<bool(int64_t epoch)> on_epoch_end;
  /// Called before each block of spectrograms `train` reads into RAM (load_dataset's poll); may throw to abandon the
  /// run before its first epoch.
  std::function<void()> on_load;
};

/// What a run did.
struct TrainResult {
  /// The run folder.
  std::filesystem::path run_dir;
  /// Epochs completed in total (including those of a resumed run).
  int64_t epochs_done = 0;
  /// Epoch (1-based) of best.pt and its best_metric value.
  int64_t best_epoch = 0;
  double best_value = 0;
  /// Whether patience ended the run early.
  bool early_stopped = false;
  /// Whether a hook stopped the run (no final evaluation then).
  bool interrupted = false;
  /// This process's rank in a data-parallel job (0 when alone); only rank 0 writes the run folder and evaluates
  /// best.pt.
  int rank = 0;
  /// best.pt on val and test (absent when interrupted).
  std::optional<EvalResult> val;
  std::optional<EvalResult> test;
};

/// Trains as `config` says (validated first), writing the run folder. With train.resume, the run's saved
/// configuration is used (only data, runtime, loader.prefetch/gpu_mem and profile_steps come from `config`) and
/// training continues after the last completed epoch; on the CPU the result is bit-identical to an uninterrupted
/// run. With a world size > 1 (config.dist, resolved from the environment), or with --dist-backend gloo|nccl or
/// --world-size 1 given (DistOptions::forces_process_group), this process is one rank of a data-parallel job joined
/// through c10d: see trainer/README.md; only rank 0 writes the run folder, every rank returns the same
/// TrainResult apart from run_dir's files (val/test are evaluated on rank 0 only). Logs on `log`. Throws InvalidArgument for bad options or a positive class that does not exist, FormatError
/// for a dataset or checkpoint that does not fit, IoError for file errors, Error when the loss becomes NaN or
/// infinite (the checkpoints of the last good epoch stay).
TrainResult train(TrainConfig config, std::ostream& log, const TrainHooks& hooks = {});

/// Throws FormatError, naming `what` (the checkpoint) and the dataset folder, unless the checkpoint's mel
/// parameters and class names equal the dataset's.
void check_checkpoint_fits(const Checkpoint& checkpoint, const MelInfo& info,
                           const std::vector<std::string>& class_names, const std::string& what,
                           const std::string& dataset);

/// `eval` settings besides the data, evaluation and runtime groups.
struct EvalCommandOptions {
  /// The checkpoint to evaluate.
  std::filesystem::path checkpoint;
  /// Where to write the JSON report (empty: nowhere; the summary is printed either way).
  std::filesystem::path out;

  /// Throws InvalidArgument when the checkpoint is missing.
  void validate() const;
};

/// Registers --checkpoint --out.
void add_options(boost::program_options::options_description& desc, EvalCommandOptions& opts);

/// `eval`: loads the checkpoint and the dataset, checks they fit, evaluates split eval.split and prints a summary
/// on `out` (and the JSON report to opts.out). Returns the report: {"checkpoint", "data", "split", "classes",
/// "positive_class", "segment", "file", "seconds", "files_per_s"}.
nlohmann::json run_eval(const EvalCommandOptions& opts, const DataOptions& data, const EvalOptions& eval,
                        const RuntimeOptions& runtime, std::ostream& out, std::ostream& log);

/// `bench` settings.
struct BenchOptions {
  /// Timed training steps (after warmup), >= 1.
  int64_t steps = 50;
  /// Untimed warmup steps, >= 0.
  int64_t warmup = 5;
  /// Where to write the JSON results (empty: nowhere).
  std::filesystem::path out;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --steps --warmup-steps --out.
void add_options(boost::program_options::options_description& desc, BenchOptions& opts);

/// `bench`: on the dataset of config.data, times separately the data pipeline (batches/s and samples/s of the
/// loader, with prefetch), the training step on a batch already in place (samples/s), and the evaluation of
/// the val split (files/s). Prints a table on `out` and returns (and writes to opts.out) the JSON.
nlohmann::json run_bench(const TrainConfig& config, const BenchOptions& opts, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
