#pragma once
/// The build: scan, split, probe, plan, then per split and per memory-bounded batch: decode, mel, compress, write.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "build_options.h"
#include "melforge/common/errors.h"

namespace melforge::builder {

/// What a finished build returns to `main`.
struct BuildResult {
  /// The report also written to OUT/build_report.json.
  nlohmann::json report;
  /// The stage timing table printed at the end.
  std::string timing_table;
};

/// A build stopped because request_stop() was called (melforge-build calls it on SIGINT or SIGTERM).
class Interrupted : public Error {
 public:
  /// `signal` is the signal number given to request_stop() (0 when none).
  Interrupted(const std::string& what, int signal) : Error(what), signal_(signal) {}
  /// The signal number given to request_stop().
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// Asks every running build of this process to stop: run_build throws Interrupted at the next file or batch
/// boundary (at most one batch of mel computation later), after removing its temporary files. `signal` (> 0) is
/// reported in the message. Only stores to a lock-free atomic, so it may be called from any thread.
void request_stop(int signal);

/// Largest batch of a build, in batch_file_bytes() summed over its files, even when --max-ram allows more. The write
/// thread compresses a batch while the main thread decodes and computes the next one, so a split must span several
/// batches for the two to overlap: with one batch per split (the demo corpus fits in 150 MiB), the main thread
/// waited 0.30 s of 0.87 s for the writer. At 32 MiB the wait is about 0.11 s, the build 10-20 % faster on 2 cores
/// and its peak RSS half (docs/PERFORMANCE.md); 8-64 MiB measured alike, within the noise of this machine.
inline constexpr int64_t kPipelineBatchBytes = int64_t{32} << 20;

/// Bytes a batch holds for one file: its arena slice of `arena_samples` float32 samples, its spectrograms of
/// `out_bytes_per_file` bytes and their compressed copy.
int64_t batch_file_bytes(int64_t arena_samples, int64_t out_bytes_per_file);

/// Bytes of batch_file_bytes() one batch may hold: `max_ram` less a reserve of 64 MiB plus one decode of
/// `largest_decode` bytes per thread, at least 1 (a batch always takes one file), at most kPipelineBatchBytes.
int64_t batch_budget(int64_t max_ram, int threads, int64_t largest_decode);

/// Throws Interrupted if request_stop() was called: the check run_build makes at file and batch boundaries.
/// (Exposed for melforge-build bench, which stops at the same boundaries.)
void check_stop();

/// Runs a whole build. Validates `config` first, so bad parameters fail before any work. Then takes an exclusive
/// lock on OUT/.melforge-build.lock (flock; released by the kernel when the process dies, so a killed build never
/// blocks the next one); a second build into the same folder is refused with IoError while the first runs. Outputs
/// are written in OUT/.partial/ and moved into OUT only when all three splits are complete; old outputs are removed
/// first (build_report.json before the HDF5 files), and build_report.json is written last and marks a complete
/// build. Throws InvalidArgument, IoError, StrictError (with --strict, on the first skipped file), Interrupted or
/// CudaError; on any error nothing in OUT is replaced, and the staging folder, the lock file and an output folder
/// the build created itself are removed.
BuildResult run_build(const BuildConfig& config);

}  // namespace melforge::builder
