#pragma once
/// `melforge-train train`, `eval` and `bench`: the training loop over a melforge-build dataset, the run folder it
/// writes, the evaluation of a checkpoint, and the benchmark of each stage on its own.
///
/// A run folder RUN holds config.json (the full configuration, mel parameters and classes), metrics.jsonl (one
/// line per epoch, and step lines every --log-every steps: train/monitor.h), the TensorBoard event files
/// events.out.tfevents.* (unless --no-tensorboard), checkpoints/last.pt and checkpoints/best.pt (written atomically
/// after every epoch), and at the end report.json (best.pt evaluated on val and test), confusion_val.csv,
/// confusion_test.csv and timings.json; trace.json with --profile-steps.
///
/// This header is the trainer's public face: train() and its hooks and result, and, included, what configures a
/// run (config.h), the `eval` command (eval/eval_command.h) and the `bench` command (bench.h). How a run is split
/// into stages: run.h.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>

#include "data/dataset.h"
#include "data/loader.h"
#include "eval/eval_command.h"
#include "eval/evaluate.h"
#include "train/bench.h"
#include "train/config.h"

namespace melforge::trainer {

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
  /// The dataset to train on in place of reading config.data.data (melforge-train cv: one fold's splits, cut from
  /// the pooled clips with their frames in RAM); called for the checks and again for the data. Empty: read the folder.
  std::function<Dataset()> dataset;
};

/// What a run did.
struct TrainResult {
  /// The run folder.
  std::filesystem::path run_dir;
  /// Epochs completed in total (including those of a resumed run).
  int64_t epochs_done = 0;
  /// Epoch (1-based) of best.pt.
  int64_t best_epoch = 0;
  /// best.pt's value of TrainOptions::best_metric.
  double best_value = 0;
  /// Whether patience ended the run early.
  bool early_stopped = false;
  /// Whether a hook stopped the run (no final evaluation then).
  bool interrupted = false;
  /// This process's rank in a data-parallel job (0 when alone); only rank 0 writes the run folder and evaluates
  /// best.pt.
  int rank = 0;
  /// best.pt on val (absent when interrupted, and on ranks > 0).
  std::optional<EvalResult> val;
  /// best.pt on test (absent when interrupted, and on ranks > 0).
  std::optional<EvalResult> test;
};

/// Trains as `config` says (validated first), writing the run folder. With train.resume, the run's saved
/// configuration is used, with the flags that config.given names honoured or refused (resume_config in
/// train/overrides.h; runtime, dist and profile_steps always come from `config`), and training continues after the
/// last completed epoch up to train.epochs; on the CPU the result is bit-identical to an uninterrupted run. With
/// train.init_from, a new run starts from those weights (train/init_weights.h). With a world size > 1 (config.dist, resolved from the environment), or with --dist-backend gloo|nccl or
/// --world-size 1 given (DistOptions::forces_process_group), this process is one rank of a data-parallel job joined
/// through c10d: see trainer/README.md; only rank 0 writes the run folder, every rank returns the same
/// TrainResult apart from run_dir's files (val/test are evaluated on rank 0 only). Logs on `log`. Throws
/// InvalidArgument for bad options or a positive class that does not exist, FormatError for a dataset or
/// checkpoint that does not fit, IoError for file errors, Error when the loss becomes NaN or infinite (the
/// checkpoints of the last good epoch stay).
TrainResult train(TrainConfig config, std::ostream& log, const TrainHooks& hooks = {});

}  // namespace melforge::trainer
