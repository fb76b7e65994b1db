#pragma once
/// The build: scan, split, probe, plan, then per split and per memory-bounded batch: decode, mel, compress, write.
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
