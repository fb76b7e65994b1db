#pragma once
/// The build: scan, split, probe, plan, then per split and per memory-bounded batch: decode, mel, compress, write.
#include <nlohmann/json.hpp>
#include <string>

#include "build_options.h"

namespace melforge::builder {

/// What a finished build returns to `main`.
struct BuildResult {
  /// The report also written to OUT/build_report.json.
  nlohmann::json report;
  /// The stage timing table printed at the end.
  std::string timing_table;
};

/// Runs a whole build. Validates `config` first, so bad parameters fail before any work. Outputs are written in
/// OUT/.partial/ and moved into OUT only when all three splits are complete; build_report.json is written last and
/// marks a complete build. Throws InvalidArgument, IoError, StrictError (with --strict, on the first skipped file) or
/// CudaError; on any error nothing in OUT is replaced.
BuildResult run_build(const BuildConfig& config);

}  // namespace melforge::builder
