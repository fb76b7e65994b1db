#include "pipeline.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "augment_stage.h"
#include "batch_runner.h"
#include "build_state.h"
#include "melforge/common/errors.h"
#include "melforge/common/timing.h"
#include "output_folder.h"
#include "plan.h"
#include "report.h"

namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

/// With --device cuda, throws CudaError when no CUDA engine can be made, before any work.
void require_cuda_if_asked(const BuildConfig& config) {
  if (config.build.device != mel::Device::cuda) return;
  if (const mel::EnginePlan plan = mel::choose_engines(config.build.device); !plan.error.empty())
    throw CudaError(plan.error);
}

/// Adds the engine check to `report`: engine_check, and after a fallback the engines that computed the build
/// (`engine`, engine_choice.engine), the reason (engine_choice.fallback_reason) and the replaced engine's device
/// bytes.
void add_engine_check(nlohmann::json& report, const BatchTotals& run) {
  report["engine_check"] = run.engine_check.to_json();
  if (!run.engine_check.fallback) return;
  report["engine"] = run.engines;
  report["engine_choice"]["engine"] = run.engines;
  report["engine_choice"]["fallback_reason"] = "engine check failed: " + run.engine_check.reason;
  report["device_buffer_bytes"] = std::max(report["device_buffer_bytes"].get<int64_t>(), run.replaced_device_bytes);
}

/// Prints the warnings of what the build padded and cut (clip_warnings) and adds them to state's warnings.
void warn_clips(BuildState& state, const BuildStats& stats) {
  for (const std::string& text : clip_warnings(state.config, stats)) {
    std::fprintf(stderr, "melforge-build: warning: %s\n", text.c_str());
    state.scan.warnings.push_back(text);
  }
}

/// The report's "speed_speakers" object (docs/FORMAT.md): the factors, the classes added, and the rows, utterances
/// and seconds added in train, in all and per factor (keyed by the factor as %g).
nlohmann::json speed_speakers_report(const BuildState& state, const std::vector<SpeakerRows>& rows) {
  const SpeedSpeakers& sp = state.speed_speakers;
  nlohmann::json per_factor = nlohmann::json::object();
  SpeakerRows all;
  int64_t classes = 0;
  for (std::size_t i = 0; i < sp.factors.size(); ++i) {
    const auto added = std::count_if(sp.labels[i].begin(), sp.labels[i].end(), [](int32_t l) { return l >= 0; });
    classes += added;
    all.rows += rows[i].rows;
    all.utterances += rows[i].utterances;
    all.seconds += rows[i].seconds;
    per_factor[speed_text(sp.factors[i])] = {{"classes_added", added}, {"rows_added", rows[i].rows},
                                              {"utterances_added", rows[i].utterances},
                                              {"seconds_added", rows[i].seconds}};
  }
  return {{"factors", sp.factors},
          {"original_classes", sp.original_classes},
          {"classes_added", classes},
          {"rows_added", all.rows},
          {"utterances_added", all.utterances},
          {"seconds_added", all.seconds},
          {"per_factor", per_factor}};
}

/// The report of a finished build and its timing table: the plan and engine of `state`, what the batches `run`
/// produced, the stage times and the total wall time. state.skipped is moved into the report's list (not copied:
/// on a corpus of many missing files it is the largest part of the plan).
BuildResult build_result(BuildState& state, const BatchTotals& run, StageTimes& times, double total_s) {
  const BuildConfig& config = state.config;
  const mel::EngineTimes et = state.engine->times();
  times.add("mel.h2d", et.h2d_s + run.replaced_times.h2d_s);
  times.add("mel.compute", et.compute_s + run.replaced_times.compute_s);
  times.add("mel.d2h", et.d2h_s + run.replaced_times.d2h_s);
  times.add("compress", run.writes[0].compress_s);
  times.add("write", run.writes[0].write_s);

  std::vector<SkippedFile> skipped = std::move(state.skipped);
  skipped.insert(skipped.end(), run.skipped.begin(), run.skipped.end());
  ReportInputs ri{config, state.class_names, run.counts,   skipped,             state.scanned,
                  run.stats, times,          total_s,      *state.engine, run.writes[0].bytes, state.engine_plan};
  BuildResult result;
  result.report = make_report(ri);
  result.report["build_id"] = state.build_id;
  add_engine_check(result.report, run);
  add_scan_notes(result.report, state);
  if (state.speed_speakers.enabled()) result.report["speed_speakers"] = speed_speakers_report(state, run.speakers);
  if (state.augment) {
    const auto copies = std::count_if(run.skipped.begin(), run.skipped.end(), [](const auto& f) { return f.copy > 0; });
    result.report["augmentation"] = augment_report(state, run.copies, copies);
  }
  if (const ShardSpec shard = config.build.shard_spec(); shard.sharded()) {
    result.report["shard"] = {{"index", shard.index},
                              {"count", shard.count},
                              {"audio_files", {state.files_range.first, state.files_range.second}},
                              {"scan_skipped", {state.skipped_range.first, state.skipped_range.second}},
                              {"corpus_entries", state.scan.files.size() + state.scan.skipped.size()},
                              {"corpus_fingerprint", corpus_fingerprint(state.scan)}};
  }
  result.timing_table = times.table(total_s);
  return result;
}

}  // namespace

BuildResult run_build(const BuildConfig& given, const AudioStages& extra_stages) {
  given.validate();
  require_cuda_if_asked(given);
  BuildConfig config = given;
  Stopwatch total;
  StageTimes times;
  OutputFolder output(config.build.output);
  BuildState state(config, extra_stages);
  {
    ScopedStage stage(times, "scan");
    scan_corpus(state);
  }
  const std::string noise_bank = use_layout_noise_bank(config, state);
  select_shard(state);
  label_files(state);
  if (state.augment) {
    ScopedStage stage(times, "augment_init");
    init_augment(state);
  }
  {
    ScopedStage stage(times, "probe");
    probe_files(state, true);
  }
  plan_clip_files(state);
  state.build_id = build_identity(state);
  {
    ScopedStage stage(times, "engine_init");
    init_engine(state);
  }
  if (state.augment) {
    ScopedStage stage(times, "augment_init");
    init_augment_device(state);
  }
  if (const std::string line = engine_choice_message(config.build.device, state.engine_plan, state.engine->name());
      !line.empty())
    std::fprintf(stderr, "melforge-build: %s\n", line.c_str());
  const std::vector<WriteTarget> targets = {{output.fresh_staging(), config.build.compression_level}};
  const BatchTotals run = run_batches(state, targets, {state.threads > 1, true, true}, times);
  check_stop();
  check_written_splits(state, run.skipped);
  warn_clips(state, run.stats);
  BuildResult result = build_result(state, run, times, total.seconds());
  std::vector<fs::path> staged = run.writes[0].files;
  if (!state.scan.trials.empty()) {
    staged.push_back(stage_trials(state.scan.trials, output.staging()));
    result.report["protocol"]["trials"] = kTrialsName;
  }
  if (!noise_bank.empty()) result.report["protocol"]["noise_bank"] = noise_bank;
  output.install(staged, result.report);
  return result;
}

}  // namespace melforge::builder
