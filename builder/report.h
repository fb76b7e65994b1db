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
#include "clip_plan.h"

namespace melforge::builder {

/// Totals over the rows written (files and their augmented copies).
struct BuildStats {
  /// Rows written.
  int64_t files = 0;
  /// Frames stored (rows of `frames`).
  int64_t frames = 0;
  /// Seconds of audio stored, every row (decoded samples at the target rate).
  double audio_seconds = 0;
  /// Clean rows (aug_copy 0): seconds of audio their files hold, whole (headers at the target rate).
  double source_seconds = 0;
  /// Clean rows (aug_copy 0): seconds of audio stored.
  double stored_seconds = 0;
  /// Clean rows: seconds cut by --max-seconds.
  double dropped_seconds = 0;
  /// Rows whose file was resampled.
  int64_t resampled = 0;
  /// Rows too short for one STFT frame, zero-padded (clip_flags bit 0).
  int64_t padded = 0;
  /// Rows cut by --max-seconds (clip_flags bit 1).
  int64_t capped = 0;
  /// Batches the corpus was processed in.
  int64_t batches = 0;
  /// Adds one written row: copy `copy` of a file of header `info`, stored as `plan`, `decoded_frames` samples decoded.
  void add_row(const audio::AudioInfo& info, const ClipPlan& plan, int copy, int64_t decoded_frames, int sample_rate);
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
  /// Compressed bytes of `frames` written.
  int64_t frame_bytes;
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

/// The warnings of what the build padded and cut, for stderr and the report's warnings (empty when none): clips
/// shorter than one STFT frame padded to one frame (clip_flags bit 0), and with --max-seconds the clips cut and the
/// seconds dropped (clip_flags bit 1).
std::vector<std::string> clip_warnings(const BuildConfig& config, const BuildStats& stats);

}  // namespace melforge::builder
