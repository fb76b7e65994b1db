#pragma once
/// How one clip is stored (schema 3, docs/FORMAT.md): its samples at the target rate, cut at --max-seconds, its frames
/// and its `clip_flags` bits; and the frames of the rows of a batch.
#include <cstdint>
#include <vector>

#include "h5_writer.h"
#include "mel/mel_args.h"
#include "mel/mel_engine.h"

namespace melforge::builder {

/// Bits of the `clip_flags` dataset (docs/FORMAT.md, schema 3).
enum StoredClipFlag : uint8_t {
  /// The clip is too short for torchaudio's STFT (mel::kClipPaddedToFrame or mel::kClipZeroEdges): zero-padded to its
  /// frame(s).
  kStoredPadded = 1,
  /// The clip was cut at --max-seconds.
  kStoredCapped = 2,
};

/// How one clip (a file, or an augmented copy of it) is stored: its samples at the target rate, cut at --max-seconds.
struct ClipPlan {
  /// Samples of the clip at the target rate (audio::output_frames of its header, at the copy's speed).
  int64_t source_samples = 0;
  /// Samples stored: source_samples, at most --max-seconds' worth. Also the clip's arena slice.
  int64_t samples = 0;
  /// Frames stored: mel::clip_frames of `samples` (>= 1).
  int64_t frames = 0;
  /// StoredClipFlag bits (the `clip_flags` entry).
  uint8_t flags = 0;
  /// True when --max-seconds cut the clip.
  bool capped() const { return (flags & kStoredCapped) != 0; }
  /// True when the clip is padded to one frame (or to zero edges).
  bool padded() const { return (flags & kStoredPadded) != 0; }
};

/// The plan of a clip of `source_samples` samples under --max-seconds `max_samples` (0: none) with `mel`'s STFT.
ClipPlan plan_clip(int64_t source_samples, int64_t max_samples, const mel::MelArgs& mel);

/// Where the kept rows of a batch lie in its arena and its output.
struct KeptRows {
  /// Metadata of each kept row, in batch order (FileRecord::frames, num_samples, clip_flags set).
  std::vector<FileRecord> records;
  /// Where each kept row starts in the arena, samples; its length is records[i].num_samples.
  std::vector<int64_t> starts;
  /// Frames of all kept rows: the output holds total_frames() * n_mels elements.
  int64_t total_frames() const;
};

/// The log-mel frames of the kept rows of a batch: `out` receives [total_frames][n_mels] elements of `dtype`, row
/// after row, each row's frames those MelEngine::compute_clips gives for its samples in `arena`. Rows that lie side
/// by side in the arena (no skipped row between them) go to the engine in one compute_clips call.
void compute_rows(mel::MelEngine& engine, const mel::MelArgs& mel, mel::DType dtype, const float* arena,
                  const KeptRows& rows, void* out);

}  // namespace melforge::builder
