#pragma once
/// The log-mel frames of a whole audio file as a schema-3 dataset stores them (the STFT of the whole decoded clip,
/// MelEngine::compute_clips), for `melforge-train predict`, `embed` and melforge.predict: the same engine call and
/// the same float16 rounding as melforge-build, so a file's frames at prediction time are the dataset's.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "mel/mel_args.h"
#include "mel/mel_engine.h"

namespace melforge::featurize {

/// One clip's frames.
struct ClipFeatures {
  /// float32 [n_frames][n_mels], frame-major (float16 parameters: the stored half values, widened exactly).
  std::vector<float> frames;
  /// Frames (>= 1: mel::clip_frames of num_samples) and mel bands.
  int64_t n_frames = 0;
  int64_t n_mels = 0;
  /// Samples of the decoded clip at the target rate.
  int64_t num_samples = 0;
  /// mel::ClipFlag bits (kClipPaddedToFrame: shorter than one STFT frame, padded to one).
  uint8_t flags = 0;
};

/// Decodes files whole (mono or one channel, resampled to mel.sample_rate as melforge-build decodes them) and
/// computes their frames with one CPU engine built once. Memory per file: its samples and its frames (a file is not
/// streamed: an hour at 16 kHz is 230 MB of samples).
class ClipFeaturizer {
 public:
  /// Builds the CPU engine for `mel` (validated) with output `dtype` and `threads` threads (0: all cores); `channel`
  /// as DecodeOptions::channel. Throws FormatError when the kernels refuse the parameters.
  ClipFeaturizer(const mel::MelArgs& mel, mel::DType dtype, int channel, int threads);
  ~ClipFeaturizer();
  ClipFeaturizer(const ClipFeaturizer&) = delete;
  ClipFeaturizer& operator=(const ClipFeaturizer&) = delete;
  /// The frames of `path`. Throws AudioError naming the file when it cannot be decoded.
  ClipFeatures operator()(const std::filesystem::path& path);
  /// The frames of `samples` (mono float32 at mel.sample_rate), as operator() computes a decoded file's.
  ClipFeatures compute(const std::vector<float>& samples);
  /// The spectrogram parameters.
  const mel::MelArgs& mel() const { return mel_; }

 private:
  mel::MelArgs mel_;
  mel::DType dtype_;
  int channel_;
  std::unique_ptr<mel::MelEngine> engine_;
};

}  // namespace melforge::featurize
