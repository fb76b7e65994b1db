#pragma once
/// Whole-file sliding windows for `melforge-train predict` and melforge.predict: a window is the unit a model is
/// trained on (one long segment of long_seconds with its num_short short segments), placed every hop samples from
/// the start of the file, the last partial one kept or dropped by the dataset's short_files policy. The audio is
/// decoded as a stream (audio::DecodeStream) and the windows' spectrograms computed a fixed-size batch at a time
/// (featurize::compute_files on the featurizer's engine), so memory does not grow with the file's length.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "audio/decode.h"
#include "featurize/featurize.h"
#include "segment/segment_args.h"

namespace melforge::windows {

/// Where the windows of one file lie, in samples at the target rate.
struct WindowPlan {
  /// Samples of the decoded file.
  int64_t frames = 0;
  /// Window length: one long segment.
  int64_t long_samples = 0;
  /// Distance between window starts, in [1, long_samples].
  int64_t hop_samples = 0;
  /// Number of windows; 0 when the file is skipped.
  int64_t count = 0;
  /// Empty when the file has windows; else why not (segment::plan_file's reason, e.g. "too short: ...").
  std::string skip_reason;
  /// First sample of window `k`.
  int64_t start(int64_t k) const { return k * hop_samples; }
  /// Samples of audio in window `k` (long_samples, or fewer for a zero-padded last window).
  int64_t audio_samples(int64_t k) const;
};

/// The hop in samples at `sample_rate` for `hop_seconds` (0: one long segment, the builder's layout). Throws
/// InvalidArgument ("--hop ...") when hop_seconds is negative, not finite, above args.long_seconds, or below one
/// sample.
int64_t hop_samples(double hop_seconds, const segment::SegmentArgs& args, int sample_rate);

/// Windows of a file of `frames` samples: starts 0, hop, 2 hop, ... while a whole window fits; then, when the end of
/// the file is not covered yet, one more window starting at the next hop holding the rest of the file zero-padded,
/// kept when args.short_files is pad and that rest is at least one short segment (the builder's rule for a file
/// shorter than one long segment), else dropped. A file shorter than one long segment is planned as the builder
/// plans it (one padded window, or skipped with plan_file's reason).
WindowPlan plan_windows(int64_t frames, const segment::SegmentArgs& args, int sample_rate, int64_t hop_samples);

/// A batch of consecutive windows of one file.
struct WindowBatch {
  /// float32 [count, num_short, n_mels, n_frames] (float16 datasets: the stored half values, widened exactly).
  std::vector<float> values;
  /// Index of the first window of the batch in the file.
  int64_t first = 0;
  /// Windows in the batch.
  int64_t count = 0;
};

/// The windows of one file, computed a batch at a time from a streamed decode. Memory: the decode stream's buffers,
/// about one window plus one read chunk of samples, batch x long_samples samples and the batch's spectrograms.
class FileWindows {
 public:
  /// Opens `path` with the featurizer's decode parameters and plans its windows. Throws AudioError naming the file
  /// when it cannot be opened or has no window (too short). `batch_windows` >= 1.
  FileWindows(featurize::Featurizer& featurizer, const std::filesystem::path& path, int64_t hop_samples,
              int64_t batch_windows);
  /// The plan (count >= 1).
  const WindowPlan& plan() const { return plan_; }
  /// The header and the decoded length.
  const audio::DecodedInto& info() const { return stream_.info(); }
  /// Fills `out` with the next min(batch_windows, remaining) windows; false (out untouched) when none is left.
  /// Throws AudioError when the file turns out unreadable (truncated, NaN, ...).
  bool next(WindowBatch& out);

 private:
  /// Drops buffered samples before `start`, reading past any gap, then reads until the buffer reaches `end`.
  void buffer(int64_t start, int64_t end);

  featurize::Featurizer& featurizer_;
  audio::DecodeStream stream_;
  WindowPlan plan_;
  int64_t batch_windows_;
  int64_t next_ = 0;
  /// Decoded samples [buf_start_, buf_start_ + buf_.size()).
  std::vector<float> buf_;
  int64_t buf_start_ = 0;
  std::vector<float> arena_;
  std::vector<uint8_t> bytes_;
  std::vector<uint8_t> scratch_;
};

}  // namespace melforge::windows
