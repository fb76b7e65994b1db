#pragma once
/// The one state a build's stages share, filled in stage order: the settings derived from the configuration, the
/// plan (scan, split, probe, segment plan: plan.h), the mel engine (batch_runner.h), then the batches. run_build and
/// run_bench are compositions of the stage functions over it.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "audio/decode.h"
#include "audio_stage.h"
#include "build_options.h"
#include "clip_plan.h"
#include "mel/mel_engine.h"
#include "scan.h"

namespace melforge::builder {

class AugmentStage;

/// A file that passed scan and probe, with its clip plan.
struct PlannedFile {
  /// The scanned file (an element of BuildState::scan.files).
  const InputFile* input = nullptr;
  /// What its header says.
  audio::AudioInfo info;
  /// Frames after decoding at the target rate (audio::output_frames).
  int64_t frames = 0;
  /// Its size, times and inode when it was probed (decode refuses a file that changed since).
  FileStamp stamp;
  /// How its clean copy is stored (set by plan_clip_files for the files this run writes).
  ClipPlan plan;
};

/// --speed-speakers: the factors and the classes they add (label_files; docs/FORMAT.md "Speed-perturbed speakers").
struct SpeedSpeakers {
  /// The factors, in the order given (BuildOptions::speed_speaker_factors); empty without the flag.
  std::vector<double> factors;
  /// Classes before the new ones (class_names.size() when the flag is not given).
  std::size_t original_classes = 0;
  /// [factor][original class]: the index of class `<class>_sp<factor>`, or -1 for a class without a train file
  /// (it gets no new class).
  std::vector<std::vector<int32_t>> labels;
  /// True when --speed-speakers was given.
  bool enabled() const { return !factors.empty(); }
};

/// What --test-trials gave the build (label_files); `list` empty when the flag is not given.
struct TestTrials {
  /// The list, as given.
  std::string list;
  /// Trials in it.
  int64_t trials = 0;
  /// Classes its paths name: the test split.
  int64_t speakers = 0;
  /// Files of those classes.
  int64_t files = 0;
  /// identity_hash of its trials (labels and paths), for the build identifier.
  std::string digest;
};

/// Settings, plan and engine of one build.
struct BuildState {
  /// Derives the settings from `config`, which must outlive the state; the audio stages are
  /// make_audio_stages(config, extra_stages).
  explicit BuildState(const BuildConfig& config, const AudioStages& extra_stages = {});

  /// The configuration.
  const BuildConfig& config;
  /// Target sample rate, Hz (config.mel.sample_rate).
  int sample_rate = 0;
  /// Worker threads (--threads resolved: 0 is every core).
  int threads = 1;
  /// The waveform augmentation (--augment-copies > 0; null otherwise): its banks are loaded by init_augment.
  std::shared_ptr<AugmentStage> augment;
  /// Per-file audio stages, decode first (then augment, when on).
  AudioStages audio_stages;

  /// What the scan found; after select_shard or the bench's sampling, `files` are the files this run considers.
  ScanResult scan;
  /// [first, last) of scan.files: the files this run writes (its shard; all of them unsharded).
  std::pair<int64_t, int64_t> files_range;
  /// [first, last) of scan.skipped: the scan's skipped entries this run reports.
  std::pair<int64_t, int64_t> skipped_range;
  /// Entries found by the scan that this run reports (audio files plus skipped ones).
  int64_t scanned = 0;
  /// Sorted labels of scan.files; a file's label index is its position.
  std::vector<std::string> class_names;
  /// Label -> index into class_names.
  std::map<std::string, int32_t> class_index;
  /// --speed-speakers: factors and the classes they added after the original ones.
  SpeedSpeakers speed_speakers;
  /// --test-trials: the list that gave the test split.
  TestTrials test_trials;
  /// [scan.files.size()]: headers of the probed files (probe_files).
  std::vector<PlannedFile> planned;
  /// [scan.files.size()]: why the probe of a file failed; empty when it succeeded or was not probed. Released by
  /// plan_clip_files once the failures are on the skipped list.
  std::vector<std::string> probe_error;
  /// --max-seconds in samples at the target rate (0: no cap).
  int64_t max_samples = 0;
  /// This build's identifier (build_identity, set once the plan is made; empty before): the `build_id` attribute of
  /// every split and the report's `build_id`.
  std::string build_id;
  /// The files of files_range that passed probe and plan, in scan order.
  std::vector<PlannedFile> usable;
  /// Files the plan stages skipped (scan, probe, segment), in the order they were found.
  std::vector<SkippedFile> skipped;

  /// The mel engine (init_engine).
  std::unique_ptr<mel::MelEngine> engine;
  /// The plan make_engine followed (auto's fallback reason).
  mel::EnginePlan engine_plan;

  /// Bytes held for the whole build besides the batches: the mel engine's host bytes (MelEngine::host_bytes), the
  /// augmentation banks and the device augmenter's pinned buffers (AugmentStage::held_bytes). Needs the engine.
  int64_t held_bytes() const;
  /// Bytes of one stored frame: n_mels elements of the build's dtype.
  int64_t frame_bytes() const;
  /// The plan of a row: `file`'s clean plan for speed 1, else the plan of the file decoded at
  /// augment::speed_decode_rate(sample_rate, speed) (a faster copy is shorter, a slower one longer), cut at
  /// --max-seconds.
  ClipPlan row_plan(const PlannedFile& file, double speed) const;
  /// The speed factors a row may have: {1}, and the --speed factors with --augment-copies.
  std::vector<double> row_speeds() const;
  /// The class of `file`'s utterance at speed-speaker factor `speaker` (an index into speed_speakers.factors), or
  /// of the file itself when `speaker` is -1.
  int32_t row_label(const PlannedFile& file, int speaker) const;
};

}  // namespace melforge::builder
