#pragma once
/// The build: the plan stages (plan.h: scan, select the shard, label, probe, plan segments), the mel engine, then
/// the batch runner (batch_runner.h: per split and per memory-bounded batch, the audio stages, mel and write), the
/// installation of the outputs and the report.
#include <nlohmann/json.hpp>
#include <string>

#include "audio_stage.h"
#include "build_options.h"
#include "stop.h"

namespace melforge::builder {

/// What a finished build returns to `main`.
struct BuildResult {
  /// The report also written to OUT/build_report.json.
  nlohmann::json report;
  /// The stage timing table printed at the end.
  std::string timing_table;
};

/// Runs a whole build. Validates `config` first, so bad parameters fail before any work. Then takes an exclusive
/// lock on OUT/.melforge-build.lock (flock; released by the kernel when the process dies, so a killed build never
/// blocks the next one); a second build into the same folder is refused with IoError while the first runs. Outputs
/// are written in OUT/.partial/, the report too, and moved into OUT only when all of them are complete
/// (OutputFolder::install: the old build_report.json is removed first, the HDF5 files are renamed over the old ones,
/// and build_report.json is renamed last: it marks a complete build). `extra_stages` run on every decoded file after decode and before mel (make_audio_stages). Throws
/// InvalidArgument, IoError, StrictError (with --strict, on the first skipped file), Interrupted or CudaError; on any
/// error nothing in OUT is replaced, and the staging folder, the lock file and an output folder the build created
/// itself are removed.
BuildResult run_build(const BuildConfig& config, const AudioStages& extra_stages = {});

}  // namespace melforge::builder
