#pragma once
/// The batch runner of a build: the mel engine, then per split and per --max-ram batch: the audio stages (decode
/// first; audio_stage.h) into one arena, mel (featurize::compute_files on the engine), and write (SplitOutputs on
/// the WriteQueue, overlapping the next batch).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "audio_stage.h"
#include "augment_stage.h"
#include "build_state.h"
#include "engine_check.h"
#include "melforge/common/timing.h"
#include "report.h"
#include "write_stage.h"

namespace melforge::builder {

/// Largest batch of a build, in batch_file_bytes() summed over its files, even when --max-ram allows more. The write
/// thread compresses a batch while the main thread decodes and computes the next one, so a split must span several
/// batches for the two to overlap: with one batch per split (the demo corpus fits in 150 MiB), the main thread
/// waited 0.30 s of 0.87 s for the writer. At 32 MiB the wait is about 0.11 s, the build 10-20 % faster on 2 cores
/// and its peak RSS half (docs/PERFORMANCE.md); 8-64 MiB measured alike, within the noise of this machine.
inline constexpr int64_t kPipelineBatchBytes = int64_t{32} << 20;

/// Bytes a batch holds for `file`: what each of `stages` declares for it (AudioStage::batch_bytes; decode: its
/// arena slice), plus its spectrograms of `out_bytes_per_file` bytes and their compressed copy.
int64_t batch_file_bytes(const AudioStages& stages, const PlannedFile& file, int64_t out_bytes_per_file);

/// Largest AudioStage::worker_bytes of `stages` over `files` (0 when there are none): what one worker thread holds
/// at most while it runs a stage on a file.
int64_t largest_worker_bytes(const AudioStages& stages, const std::vector<PlannedFile>& files);

/// Part of --max-ram that batch_reserve keeps whatever the build: the program's own memory (binary, libraries, HDF5,
/// FFTW and deflate state, thread stacks; about 45 MiB for a tiny build) and the write queue's small buffers.
inline constexpr int64_t kFixedReserveBytes = int64_t{64} << 20;

/// Bytes of --max-ram that no batch may use: kFixedReserveBytes, `worker_bytes` per thread (largest_worker_bytes:
/// decode's chunk and resampler, at most about 1.6 MiB) and the `engine_bytes` held for the whole build
/// (BuildState::held_bytes: MelEngine::host_bytes, the CPU scratch or the CUDA engine's pinned staging buffers, plus
/// the augmentation banks).
int64_t batch_reserve(int threads, int64_t worker_bytes, int64_t engine_bytes);

/// Bytes of batch_file_bytes() one batch may hold: `max_ram` less batch_reserve(); at least 1 (a batch always takes
/// one file), at most kPipelineBatchBytes.
int64_t batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes);

/// The batch budget the batch runner of `state` uses: batch_budget(--max-ram, threads, largest_worker_bytes of the
/// audio stages over state.usable, state.held_bytes()). Recomputed by the runner when the engine check falls back
/// to the CPU. Needs state.engine.
int64_t runner_batch_budget(const BuildState& state);

/// Bytes of batch_file_bytes() the batch an engine check compares may hold: half of what `max_ram` leaves after
/// batch_reserve() and `check_bytes` (what the check holds besides its copies of the batch: the CPU twin's host
/// bytes and its augmenter's scratch per thread), since the check holds a second copy of the batch's spectrograms
/// and of its augmented rows' samples, each at most the batch's own; at least 1, at most kPipelineBatchBytes.
int64_t check_batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes,
                           int64_t check_bytes);

/// The most long segments per file that fit `file_budget` bytes at `long_segment_bytes` each: file_budget /
/// long_segment_bytes, at least 1.
int num_long_cap(int64_t file_budget, int64_t long_segment_bytes);

/// Bytes one long segment of one file holds at most while the batches run: 4 * long_samples of arena and four
/// copies of its spectrograms (num_short * out_bytes_per_segment): the batch's output buffer, and, while the next batch
/// is computed into the other one, the buffer being written with its shuffled and compressed copies. Needs
/// state.engine.
int64_t long_segment_bytes(const BuildState& state);

/// Keeps one file within --max-ram. A batch always takes one file, however large, so one file of num_long long
/// segments may hold num_long * long_segment_bytes; with everything else the build holds, besides its fixed overhead
/// (kFixedReserveBytes covers it in batch_budget), that must fit --max-ram: the cap is num_long_cap(max_ram - threads *
/// largest worker bytes - engine host bytes, long_segment_bytes). When state.num_long is larger: with --num-long
/// auto, num_long becomes the cap and every file of state.usable is planned again with it (longer files are cut and
/// counted as capped), with a one-line warning on stderr naming the auto value, the bytes, the cap and --num-long;
/// with --num-long given, the value is kept and the warning says that the build will exceed --max-ram. Needs
/// state.engine.
void fit_num_long(BuildState& state);

/// The configuration of the build's mel engine (and of the engine check's CPU twin): --device's engine for short
/// segments of `state`, on state.threads threads.
mel::EngineConfig engine_config(const BuildState& state);

/// Stage "engine_init": makes the mel engine of --device for short segments on state.threads threads (state.engine,
/// state.engine_plan; a previous engine is freed first), then fits num_long to --max-ram (fit_num_long), which needs
/// the engine's host bytes and spectrogram size. Throws CudaError or InvalidArgument.
void init_engine(BuildState& state);

/// How run_batches runs.
struct RunOptions {
  /// Compress and write each batch on a background thread while the next one is decoded; false writes in line.
  bool background_writes = true;
  /// Print a progress bar per split (unless --quiet).
  bool show_progress = true;
  /// Run the engine check (engine_check.h) where it applies; run_build does, the bench's stage runs do not.
  bool engine_check = false;
};

/// What one run of the batches produced.
struct BatchTotals {
  /// Totals over the files written.
  BuildStats stats;
  /// [split] class name -> rows written (files, and their augmented copies; every class present).
  std::vector<std::map<std::string, int64_t>> counts;
  /// [split] class name -> {clean, augmented} rows written (every class present).
  CopyCounts copies;
  /// Files the audio stages skipped, in the order found.
  std::vector<SkippedFile> skipped;
  /// [target]: what its writers did.
  std::vector<WriteTotals> writes;
  /// The engine check's outcome (result "skipped" when RunOptions::engine_check is false).
  EngineCheckSummary engine_check;
  /// The engines that computed the spectrograms, distinct, in the order used, joined by " + ": state.engine's name,
  /// or after a fallback of the engine check "cuda-cufft + cpu-fftw" (or the CPU engine's alone when the device's
  /// result of no batch was written).
  std::string engines;
  /// Times and device bytes of an engine the check's fallback replaced (zero otherwise), for the report.
  mel::EngineTimes replaced_times;
  /// Device bytes the replaced engine held.
  int64_t replaced_device_bytes = 0;
};

/// Runs the batches of every split in order (train, val, test) over the rows of state.usable (split_copies: each file,
/// then its augmented copies), whose plan and engine are set: rows are taken in order into batches of at most
/// runner_batch_budget bytes of batch_file_bytes (at least one row; check_batch_budget for a batch the engine check
/// compares); each batch runs the audio stages (times under their names), mel ("mel"), the engine check when it
/// compares the batch ("engine_check"), then is posted to the writers of every target ("write_wait": the wait for
/// the previous batch's write). A row an audio stage skips is listed, an augmented copy with its copy index
/// (StrictError under --strict). Each target's folder must exist; it receives <split>.h5 for every split. `state` is
/// changed only by a fallback of the engine check (state.engine becomes the CPU engine, the augment stage the CPU
/// augmenter). Throws Interrupted at file and batch boundaries, IoError, CudaError, EngineCheckError.
BatchTotals run_batches(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
                        StageTimes& times);

}  // namespace melforge::builder
