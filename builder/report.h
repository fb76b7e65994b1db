#pragma once
/// The build report: configuration, counts, skipped files, stage times, throughput and memory.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio/decode.h"
#include "build_options.h"
#include "mel/mel_engine.h"
#include "melforge/common/timing.h"
#include "scan.h"
#include "segment/segment_args.h"

namespace melforge::builder {

/// Totals over the files written.
struct BuildStats {
  /// Files written.
  int64_t files = 0;
  /// Short segments computed (valid ones only).
  int64_t segments = 0;
  /// Seconds of decoded audio at the target rate in the files written.
  double audio_seconds = 0;
  /// Files that were resampled.
  int64_t resampled = 0;
  /// Files with more whole long segments than num_long.
  int64_t capped = 0;
  /// Files shorter than one long segment, zero-padded.
  int64_t padded = 0;
  /// Files with fewer valid long segments than num_long.
  int64_t partial = 0;
  /// Seconds of audio not used (tails and capped parts).
  double dropped_seconds = 0;
  /// Batches the corpus was processed in.
  int64_t batches = 0;
  /// Adds one written file.
  void add_file(const audio::AudioInfo& info, const segment::FilePlan& plan, int64_t decoded_frames, int sample_rate);
};

/// Everything the report is made from.
struct ReportInputs {
  const BuildConfig& config;
  const std::vector<std::string>& class_names;
  /// [split] class name -> files written.
  const std::vector<std::map<std::string, int64_t>>& counts;
  const std::vector<SkippedFile>& skipped;
  /// Entries found by the scan (audio files + skipped at scan).
  int64_t scanned;
  const BuildStats& stats;
  const StageTimes& times;
  double total_seconds;
  const mel::MelEngine& engine;
  int num_long;
  int num_short;
  const mel::MelLayout& layout;
  /// Compressed bytes of mel written.
  int64_t mel_bytes;
  /// The engine plan make_engine followed (auto's fallback reason).
  const mel::EnginePlan& engine_plan;
};

/// The report's `engine_choice` object: {"device": requested device, "engine": `engine_name`, "cuda_devices":
/// [{"index", "name": "<name> (compute capability X.Y)" or null}] of the plan's devices, "cuda_query": the device
/// query's description or null (device cpu), "fallback_reason": why auto chose the CPU or left devices out, or
/// null}.
nlohmann::json engine_choice_json(mel::Device device, const mel::EnginePlan& plan, const std::string& engine_name);

/// The line a build prints when auto did not use every CUDA device: "--device auto: <engine_name> engine: <reason>";
/// empty when there is no fallback reason.
std::string engine_choice_message(mel::Device device, const mel::EnginePlan& plan, const std::string& engine_name);

/// Builds the report JSON (documented in docs/FORMAT.md).
nlohmann::json make_report(const ReportInputs& in);

}  // namespace melforge::builder
