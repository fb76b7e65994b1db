#pragma once
/// The engine check (issue 27): no GPU has ever run the CUDA code and no test suite covers every GPU, so a build
/// with the CUDA engine verifies itself. Its first batch, and with augmentation its first batch holding an augmented
/// row, are computed again by the CPU twin (the CPU mel engine; the CPU augmenter from the same decoded samples) and
/// compared at the documented tolerance (docs/FORMAT.md, "Engines and bytes"): the spectrograms at
/// mel::compare_mel's bound, each augmented row's waveform within augment::kCudaAbsTolerance of its peak. A mismatch
/// stops a --device cuda build (EngineCheckError); under --device auto the build falls back to the CPU engine and
/// the CPU augmenter from that batch on, and writes the twin's result of the compared batch. The outcome goes to the
/// report's engine_check (EngineCheckSummary). --no-engine-check skips it; with the CPU engine it does not apply.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio_stage.h"
#include "clip_plan.h"
#include "h5_writer.h"
#include "mel/mel_compare.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge::builder {

struct BuildState;

/// A mismatch of the engine check under --device cuda. main exits 1 with its message, which names the largest
/// difference and where it was.
class EngineCheckError : public CudaError {
 public:
  using CudaError::CudaError;
};

/// What the engine check did: the report's engine_check object (docs/FORMAT.md).
struct EngineCheckSummary {
  /// True when a batch was compared.
  bool ran = false;
  /// The engine under check (the device's, e.g. "cuda-cufft"); the build's engine when the check did not run.
  std::string engine;
  /// The augmenter under check ("cuda-cufft"); empty without augmentation or when the check did not run.
  std::string augmenter;
  /// "passed", "failed", "skipped" (--no-engine-check, or nothing to compare) or "not_applicable" (CPU engine).
  std::string result = "not_applicable";
  /// Why, in words.
  std::string reason;
  /// True when the build fell back to the CPU engine after a mismatch (--device auto).
  bool fallback = false;
  /// 1-based batch of the build from which the CPU engine computed (0: no fallback).
  int64_t fallback_batch = 0;
  /// Batches compared.
  int batches_compared = 0;
  /// Frames in the compared batches.
  int64_t frames_compared = 0;
  /// Augmented rows (recipes with an impulse response, a noise or a gain) whose waveforms were compared.
  int64_t augmented_compared = 0;
  /// Largest |device - cpu| of the spectrograms compared; negative when none was.
  double max_abs_diff = -1;
  /// Largest |device - cpu| of the augmented waveforms compared; negative when none was.
  double augment_max_abs_diff = -1;
  /// The mel tolerance of the last comparison (its abs depends on the batch with log none).
  mel::MelTolerance tolerance;
  /// The element reported: the largest difference outside the tolerance of the comparison that failed, else the
  /// largest difference of the spectrograms; null when nothing was compared.
  nlohmann::json where;
  /// The report's object.
  nlohmann::json to_json() const;
};

/// The summary before any batch: "not_applicable" with the CPU engine (unless the test hook's cpu_acts_as makes the
/// CPU engine act as the device), "skipped" with --no-engine-check, else the check applies (result "passed" until a
/// comparison fails). Needs state.engine.
EngineCheckSummary initial_engine_check(const BuildState& state);

/// The engine check as the batch runner drives it, over the state of a build whose engine (and device augmenter)
/// are made. For a batch it compares, the runner loads the batch with stages() in place of the build's audio stages,
/// computes the spectrograms on the device, then calls compare().
class EngineCheck {
 public:
  /// The check of `state`, whose initial_engine_check applies; the state outlives it.
  explicit EngineCheck(BuildState& state);
  ~EngineCheck();
  EngineCheck(const EngineCheck&) = delete;
  EngineCheck& operator=(const EngineCheck&) = delete;

  /// True while a comparison is pending for `rows`: the first batch of the build, and, with augmentation, a batch
  /// holding a row whose recipe augments (Recipe::augments) until such a row was compared.
  bool wants(std::span<const PlannedCopy> rows) const;
  /// Host bytes the check holds for a compared batch besides its copies of the batch: the CPU twin engine's host
  /// bytes and, with augmentation, its augmenter's largest scratch per thread (for check_batch_budget).
  int64_t held_bytes() const;
  /// The audio stages of compared batch `number` (1-based in the build) of split `split`: the build's, with, while
  /// the augmented comparison is pending, a stage that keeps the decoded samples of the augmenting rows before
  /// "augment" and one after it that applies the CPU augmenter to them and compares (both "engine_check"). A
  /// mismatch there throws EngineCheckError under --device cuda; under auto the CPU rows replace the device's in the
  /// arena at once.
  AudioStages stages(int64_t number, std::size_t split) const;

  /// One compared batch as the runner holds it (the one whose stages() were used).
  struct Batch {
    /// The batch's rows after the audio stages (their errors set), spans into `arena`.
    std::span<BatchFile> files;
    /// The kept rows in order and where they lie in the arena (as compute_rows takes them).
    const KeptRows& kept;
    /// The arena.
    const float* arena = nullptr;
  };
  /// Compares the device's frames of `batch` in `device_out` (compute_rows' layout, the test hook's mel offset added
  /// first) with the CPU twin's (a CPU engine of engine_config, made for the batch). Nothing when no row
  /// was kept (the comparison stays pending). On a match, leaves `device_out` as it is. On a mismatch, of the
  /// spectrograms or of the augmented rows of stages(), under --device cuda throws EngineCheckError naming the
  /// largest difference; under auto writes the twin's result of the batch (CPU augmenter, the stages after augment,
  /// CPU engine) into `device_out`, prints the reason to stderr, and makes the state's engine the twin and its
  /// augment stage the CPU augmenter (fell_back() is then true).
  void compare(const Batch& batch, std::vector<uint8_t>& device_out);
  /// True after the fallback.
  bool fell_back() const;
  /// The summary so far; "skipped" when the check applied but no batch held a row to compare.
  EngineCheckSummary summary() const;
  /// The replaced engine's times and device bytes (zero without a fallback).
  mel::EngineTimes replaced_times() const;
  int64_t replaced_device_bytes() const;

  /// The check's state (engine_check.cpp), named here so that the stages stages() adds can reach it.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace melforge::builder
