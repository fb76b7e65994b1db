#pragma once
/// What `train` shows to profilers: named ranges around the stages of a step (seen by --profile-steps and by
/// Nsight), and the LibTorch profiler over the first steps of a run, saved as a Chrome trace.
#include <ATen/record_function.h>

#include <cstdint>
#include <filesystem>

namespace melforge::trainer {

/// A profiler range (RecordFunction, seen by --profile-steps) and an NVTX range (seen by Nsight, on CUDA builds)
/// for its scope.
class TraceRange {
 public:
  /// Opens the range `name`; the destructor closes it.
  explicit TraceRange(const char* name);
  ~TraceRange();
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  at::RecordFunction rf_;
};

/// The LibTorch profiler (Kineto) over a number of steps, saved as a Chrome trace.
class StepProfiler {
 public:
  /// Starts profiling the CPU (and CUDA when `cuda`) for `steps` steps, to be saved at `path`; `steps` <= 0: off.
  StepProfiler(int64_t steps, std::filesystem::path path, bool cuda);
  /// Counts a step; stops and saves after the last one.
  void step();
  /// Stops and saves now (if still running).
  void finish();
  /// finish(), errors ignored.
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

 private:
  int64_t steps_, done_ = 0;
  std::filesystem::path path_;
  bool active_ = false;
};

}  // namespace melforge::trainer
