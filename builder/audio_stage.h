#pragma once
/// Per-file audio stages of the batch runner: decode, then any stage that works on a file's waveform before the mel
/// spectrogram (waveform augmentation: augment_stage.h). As with DALI's operators, a stage first says what it
/// needs (bytes per file of the batch, bytes per worker; the --max-ram batch planning reads them) and then runs on
/// the batch; the computation it calls lives in kernels/.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "audio/decode.h"
#include "augment/augment.h"
#include "build_options.h"
#include "clip_plan.h"
#include "melforge/common/progress.h"
#include "melforge/common/timing.h"

namespace melforge::builder {

struct PlannedFile;

/// What the file system says about an input file when it is probed: its size and modification time. Decode compares
/// them (and the header: frames, rate, channels) with the probe's, so that a file changed between the probe and the
/// decode (hours apart on a long build) is skipped, never stored with the probe's length and rate.
struct FileStamp {
  /// Size in bytes (st_size).
  int64_t size = -1;
  /// Modification time in nanoseconds since the epoch (st_mtim).
  int64_t mtime_ns = 0;
  /// Inode number: a file replaced by a rename gets another.
  uint64_t inode = 0;
  bool operator==(const FileStamp&) const = default;
};

/// The stamp of `path` (following links), or a stamp with size -1 when it cannot be stat'ed.
FileStamp file_stamp(const std::filesystem::path& path);

/// Why `now` (the header and stamp read at decode) is not the file `probed` (those of the probe), as a skip reason
/// ("changed since it was probed: size (bytes) 88244 -> 4044; ..."), or "" when they agree. A stamp of size -1
/// (never recorded) compares only the headers; a header of 0 frames (never probed, or unreadable now) only the
/// stamps.
std::string change_since_probe(const audio::AudioInfo& probed_info, const FileStamp& probed,
                               const audio::AudioInfo& now_info, const FileStamp& now);

/// One row of a split: a file and the recipe of its copy (--augment-copies). Copy 0 is the file itself; copies
/// 1..K are decoded (at their speed) and augmented from it, each a whole clip of its own length.
struct PlannedCopy {
  /// The file and its plan.
  const PlannedFile* file = nullptr;
  /// The copy's recipe (the identity for copy 0).
  augment::Recipe recipe;
  /// How the row is stored (BuildState::row_plan at the recipe's speed times speaker_speed): its arena slice is
  /// plan.samples samples.
  ClipPlan plan;
  /// --speed-speakers: the factor of the new speaker this row is an utterance of (1: the file's own speaker). The
  /// decode runs at recipe.speed * speaker_speed.
  double speaker_speed = 1.0;
  /// Index of that factor in BuildState::speed_speakers.factors; -1 for a row of the file's own speaker.
  int speaker = -1;
};

/// One file of a batch as the audio stages see it.
struct BatchFile {
  /// The file and its plan.
  const PlannedFile* file = nullptr;
  /// Which copy of the file this is and what it does (the identity for copy 0, and without augmentation).
  augment::Recipe recipe;
  /// How the row is stored (PlannedCopy::plan).
  ClipPlan plan;
  /// PlannedCopy::speaker_speed.
  double speaker_speed = 1.0;
  /// PlannedCopy::speaker.
  int speaker = -1;
  /// Its arena slice: plan.samples float32 samples at the target rate. Decode writes the audio (zeros after it, should
  /// the decoder give fewer samples than the header promised); the stages after decode change the samples in place.
  std::span<float> samples;
  /// Samples of audio decoded into the slice, set by decode (plan.samples unless the decoder gave fewer).
  int64_t decoded_frames = 0;
  /// Why a stage skipped the file (its AudioError's message); empty while the file is kept.
  std::string error;
  /// Name of the stage that skipped the file.
  std::string error_stage;
};

/// A stage that runs on each decoded file of a batch, in place in the arena, between decode and mel.
class AudioStage {
 public:
  virtual ~AudioStage() = default;
  /// Name in the stage timings (the report's times_s, the bench's stages) and in a skipped file's `stage`.
  virtual std::string name() const = 0;
  /// Setup: bytes the batch holds for `row` because of this stage, from the batch's start to its end (decode: the
  /// arena slice, 4 * plan.samples). batch_row_bytes() adds them up for the --max-ram batch planning.
  virtual int64_t batch_bytes(const PlannedCopy& /*row*/) const { return 0; }
  /// Setup: bytes one worker thread holds while it runs the stage on `row`, freed when run() returns (decode:
  /// audio::decode_bytes). --max-ram reserves the largest of them once per thread.
  virtual int64_t worker_bytes(const PlannedCopy& /*row*/) const { return 0; }
  /// Runs the stage on one file that no earlier stage skipped. Called from several threads at once, each on another
  /// file. Throws AudioError to skip the file (listed as skipped at this stage, or StrictError under --strict); any
  /// other error stops the build.
  virtual void run(BatchFile& file) const = 0;
  /// True when the stage runs once per batch (run_batch) rather than once per file (run).
  virtual bool batched() const { return false; }
  /// Runs a batched() stage on the files of a batch that no earlier stage skipped (those with an empty `error`),
  /// on the calling thread. Throws like run(); an AudioError stops the build, since it cannot name one file.
  virtual void run_batch(std::span<BatchFile> /*files*/) const {}
};

/// The audio stages of a build, in the order they run.
using AudioStages = std::vector<std::shared_ptr<const AudioStage>>;

/// The first stage: decodes the file (libsndfile, soxr to the target rate, one channel or the mix-down) into its
/// arena slice, reading only as far as the slice needs (audio::decode_to: the whole clip, or its first
/// --max-seconds). An augmented copy with a speed factor, and a --speed-speakers row, is decoded at
/// augment::speed_decode_rate(rate, speed) into a slice of its own length (BuildState::row_plan).
class DecodeStage final : public AudioStage {
 public:
  /// `decode`: the target sample rate and channel.
  explicit DecodeStage(const audio::DecodeOptions& decode) : decode_(decode) {}
  /// "decode".
  std::string name() const override { return "decode"; }
  /// 4 * row.plan.samples.
  int64_t batch_bytes(const PlannedCopy& row) const override;
  /// audio::decode_bytes of the file's header at the row's decode rate, capped at the slice.
  int64_t worker_bytes(const PlannedCopy& row) const override;
  /// Fills file.samples and file.decoded_frames at the rate of file.recipe.speed * file.speaker_speed; throws
  /// AudioError when the file cannot be decoded, and when it changed since the probe (change_since_probe: its size,
  /// times or inode before the decode, or the header the decode read): the file is then skipped at "decode" with that
  /// reason.
  void run(BatchFile& file) const override;

 private:
  /// The options at the decode rate of `speed` (augment::speed_decode_rate when it is not 1).
  audio::DecodeOptions at_speed(double speed) const;
  audio::DecodeOptions decode_;
};

/// The one place where the audio stages of a build are chosen, used by run_build and run_bench alike: decode (with
/// `config.decode` at config.mel.sample_rate), then `augment` when given
/// (the waveform augmentation, made by BuildState when --augment-copies > 0), then `extra` in order.
AudioStages make_audio_stages(const BuildConfig& config, const AudioStages& extra,
                              const std::shared_ptr<const AudioStage>& augment = nullptr);

/// Runs `stages` in order over the files of one batch: each stage on every file still kept, on `threads` threads (a
/// batched() stage once over the batch, on this thread), its wall time added to `times` under its name. A file that a
/// stage skips gets `error` and `error_stage` and no later stage; `progress` advances by one when a file is skipped or
/// has passed the last stage. Throws Interrupted (checked before each file), or what a stage throws other than
/// AudioError.
void run_audio_stages(const AudioStages& stages, std::span<BatchFile> files, int threads, StageTimes& times,
                      Progress& progress);

}  // namespace melforge::builder
