#pragma once
/// Monitoring of a training run (rank 0): per-step lines in RUN/metrics.jsonl every --log-every optimizer steps, and
/// TensorBoard event files in RUN (common/tensorboard.h) with the same per-step scalars, every epoch's metrics and
/// the validation confusion matrix as an image.
///
/// metrics.jsonl holds two kinds of lines, told apart by "type": "epoch" (one per epoch, written by the run) and
/// "step": {"type": "step", "epoch": E (1-based, the epoch in progress), "step": S (optimizer steps taken),
/// "loss": mean training loss of step S's micro-batches on rank 0 (null when not finite), "lr": its learning rate,
/// "samples_per_s": the job's training samples per second and "data_wait_fraction": rank 0's share of that time
/// spent waiting for batches, both over the steps since the previous step line or the epoch's start}.
/// TensorBoard tags: "step/<key>" for loss, lr, samples_per_s, data_wait_fraction at step S; "epoch/<key>" for every
/// number of the epoch line (NaN for null) at the epoch's last step; "epoch/val_confusion" the image.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "melforge/common/tensorboard.h"
#include "melforge/common/timing.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// What a run logs beyond its epoch lines.
struct MonitorOptions {
  /// Write a step line (metrics.jsonl and TensorBoard) every this many optimizer steps; 0: none.
  int64_t log_every = 10;
  /// Write TensorBoard event files into the run folder.
  bool tensorboard = true;

  /// Throws InvalidArgument naming --log-every when it is negative.
  void validate() const;
};

/// Registers --log-every and --no-tensorboard.
void add_options(boost::program_options::options_description& desc, MonitorOptions& opts);

/// The monitoring of one run on rank 0: step lines and the event file. Not thread-safe.
class RunMonitor {
 public:
  /// Appends to `run_dir`/metrics.jsonl and, with opts.tensorboard, opens a new event file in `run_dir`. A resumed
  /// run (`resumed`, after `step` optimizer steps) starts the file with a session start at step + 1, so that
  /// TensorBoard drops the events an interrupted run wrote after its checkpoint. Throws IoError when the event
  /// file cannot be created.
  RunMonitor(const std::filesystem::path& run_dir, const MonitorOptions& opts, int64_t step, bool resumed);
  ~RunMonitor();
  RunMonitor(const RunMonitor&) = delete;
  RunMonitor& operator=(const RunMonitor&) = delete;

  /// Starts the measuring interval at an epoch's start (the loader's wait counter is then 0).
  void start_epoch();
  /// Counts one micro-batch: its mean loss (a scalar tensor on any device, read only at a logged step) and the
  /// job's samples in it.
  void add_batch(const at::Tensor& loss, int64_t samples);
  /// Ends optimizer step `step` (1-based count) of 1-based `epoch` at learning rate `lr`, after `wait_s` seconds of
  /// the epoch spent waiting for batches; writes a step line when `step` is a multiple of log_every.
  void end_step(int64_t epoch, int64_t step, double lr, double wait_s);
  /// Writes the epoch line's numbers and the row-normalised `confusion` [true][predicted] (no image when empty) at
  /// the line's "step" into the event file, and flushes it.
  void end_epoch(const nlohmann::json& line, const std::vector<std::vector<int64_t>>& confusion);
  /// Closes the event file (IoError when its last records cannot be written).
  void close();

 private:
  std::filesystem::path metrics_;
  MonitorOptions opts_;
  std::unique_ptr<tensorboard::EventWriter> events_;
  at::Tensor loss_sum_;
  int64_t micro_ = 0, samples_ = 0;
  Stopwatch interval_;
  double wait_start_ = 0;
};

/// The step line's JSON (see the file comment).
nlohmann::json step_line(int64_t epoch, int64_t step, double loss, double lr, double samples_per_s,
                         double data_wait_fraction);

/// The PNG of a confusion matrix [true][predicted], each row divided by its total (a row without examples is grey),
/// drawn with heat_map and heat_map_cell; `height` and `width` receive its size in pixels.
std::string confusion_png(const std::vector<std::vector<int64_t>>& confusion, int64_t& height, int64_t& width);

}  // namespace melforge::trainer
