#pragma once
/// The batch runner of a build: the mel engine, then per split and per --max-ram batch: the audio stages (decode
/// first; audio_stage.h) into one arena, mel (MelEngine::compute_clips over the whole clips), and write (SplitOutputs
/// on the WriteQueue, overlapping the next batch).
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

/// Largest batch of a build, in batch_row_bytes() summed over its rows, even when --max-ram allows more. The write
/// thread compresses a batch while the main thread decodes and computes the next one, so a split must span several
/// batches for the two to overlap: with one batch per split (the demo corpus fits in 150 MiB), the main thread
/// waited 0.30 s of 0.87 s for the writer. At 32 MiB the wait is about 0.11 s, the build 10-20 % faster on 2 cores
/// and its peak RSS half (docs/PERFORMANCE.md); 8-64 MiB measured alike, within the noise of this machine.
inline constexpr int64_t kPipelineBatchBytes = int64_t{32} << 20;

/// Bytes a batch holds for `row`: what each of `stages` declares for it (AudioStage::batch_bytes; decode: its arena
/// slice), plus its frames (row.plan.frames of `frame_bytes` bytes) and their compressed copy.
int64_t batch_row_bytes(const AudioStages& stages, const PlannedCopy& row, int64_t frame_bytes);

/// Every row the batches of `state` may hold, as far as memory goes: each file of state.usable at each of
/// BuildState::row_speeds (the clean copy, and a copy at each --speed factor), and each train file also at each of
/// them times each --speed-speakers factor, with its row plan.
std::vector<PlannedCopy> memory_rows(const BuildState& state);

/// Largest AudioStage::worker_bytes of `stages` over memory_rows(state) (0 when there are none): what one worker
/// thread holds at most while it runs a stage on a row.
int64_t largest_worker_bytes(const AudioStages& stages, const BuildState& state);

/// Part of --max-ram that batch_reserve keeps whatever the build: the program's own memory (binary, libraries, HDF5,
/// FFTW and deflate state, thread stacks; about 45 MiB for a tiny build) and the write queue's small buffers.
inline constexpr int64_t kFixedReserveBytes = int64_t{64} << 20;

/// Bytes of --max-ram that no batch may use: kFixedReserveBytes, `worker_bytes` per thread (largest_worker_bytes:
/// decode's chunk and resampler, at most about 1.6 MiB) and the `engine_bytes` held for the whole build
/// (BuildState::held_bytes: MelEngine::host_bytes, the CPU scratch or the CUDA engine's pinned staging buffers, plus
/// the augmentation banks).
int64_t batch_reserve(int threads, int64_t worker_bytes, int64_t engine_bytes);

/// Bytes of batch_row_bytes() one batch may hold: `max_ram` less batch_reserve(); at least 1 (a batch always takes
/// one row), at most kPipelineBatchBytes.
int64_t batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes);

/// The batch budget the batch runner of `state` uses: batch_budget(--max-ram, threads, largest_worker_bytes of the
/// audio stages, state.held_bytes()). Recomputed by the runner when the engine check falls back to the CPU. Needs
/// state.engine.
int64_t runner_batch_budget(const BuildState& state);

/// Bytes of batch_row_bytes() the batch an engine check compares may hold: half of what `max_ram` leaves after
/// batch_reserve() and `check_bytes` (what the check holds besides its copies of the batch: the CPU twin's host
/// bytes and its augmenter's scratch per thread), since the check holds a second copy of the batch's frames and
/// of its augmented rows' samples, each at most the batch's own; at least 1, at most kPipelineBatchBytes.
int64_t check_batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes,
                           int64_t check_bytes);

/// Warns when a clip alone needs more than --max-ram leaves after the per-thread and engine buffers (batch_reserve()
/// less kFixedReserveBytes, the program's own memory, which the documented overhead covers): a batch always takes one
/// row, so the build then uses more than --max-ram. One line on stderr (and in the report's warnings) with the count,
/// the largest clip, its bytes and --max-seconds. Needs state.engine.
void check_row_memory(BuildState& state);

/// The configuration of the build's mel engine (and of the engine check's CPU twin): --device's engine on
/// state.threads threads, its segment layout (the CPU engine's FFT block, the CUDA engine's launch) that of the
/// default tile (--short-seconds).
mel::EngineConfig engine_config(const BuildState& state);

/// Stage "engine_init": makes the mel engine of --device on state.threads threads (state.engine, state.engine_plan; a
/// previous engine is freed first), then check_row_memory. Throws CudaError or InvalidArgument.
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

/// The rows written for one --speed-speakers factor.
struct SpeakerRows {
  /// Rows written: utterances and their augmented copies.
  int64_t rows = 0;
  /// Utterances written (aug_copy 0).
  int64_t utterances = 0;
  /// Seconds of audio in those rows (decoded samples at the target rate).
  double seconds = 0;
  /// Counts one row of augmented copy `copy` (0: the utterance) holding `decoded` samples at `sample_rate`.
  void add(int copy, int64_t decoded, int sample_rate) {
    ++rows;
    utterances += copy == 0 ? 1 : 0;
    seconds += static_cast<double>(decoded) / sample_rate;
  }
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
  /// [factor of BuildState::speed_speakers]: the speed-speaker rows written.
  std::vector<SpeakerRows> speakers;
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
/// runner_batch_budget bytes of batch_row_bytes (at least one row; check_batch_budget for a batch the engine check
/// compares); each batch runs the audio stages (times under their names), mel ("mel"), the engine check when it
/// compares the batch ("engine_check"), then is posted to the writers of every target ("write_wait": the wait for
/// the previous batch's write). A row an audio stage skips is listed, an augmented copy with its copy index
/// (StrictError under --strict). Each target's folder must exist; it receives <split>.h5 for every split. `state` is
/// changed only by a fallback of the engine check (state.engine becomes the CPU engine, the augment stage the CPU
/// augmenter). Throws Interrupted at file and batch boundaries, IoError, CudaError, EngineCheckError.
BatchTotals run_batches(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
                        StageTimes& times);

}  // namespace melforge::builder
