#pragma once
/// Audio decoding through libsndfile, with mix-down or channel selection and resampling through libsoxr.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::audio {

/// What the file's header says.
struct AudioInfo {
  /// Frames (samples per channel) the header claims.
  int64_t frames = 0;
  /// Native sample rate, Hz.
  int sample_rate = 0;
  /// Channel count.
  int channels = 0;
  /// Container and encoding, e.g. "WAV PCM_16", "FLAC PCM_24", "OGG VORBIS".
  std::string format;
  /// Duration in seconds at the native rate.
  double seconds() const { return sample_rate > 0 ? static_cast<double>(frames) / sample_rate : 0.0; }
};

/// How decoded audio is turned into the mono float32 signal the mel engine reads.
struct DecodeOptions {
  /// Target sample rate, Hz. Files at another rate are resampled (soxr, high quality).
  int sample_rate = 16000;
  /// Channel to keep (0-based); -1 averages all channels to mono.
  int channel = -1;
};

/// Registers --channel on `desc`, bound to `opts.channel`. (--sample-rate belongs to the mel flags.)
void add_options(boost::program_options::options_description& desc, DecodeOptions& opts);

/// Mono float32 audio at the target rate.
struct DecodedAudio {
  /// [frames] samples in [-1, 1] for PCM input (float files may exceed it).
  std::vector<float> samples;
  /// Header of the source file.
  AudioInfo info;
  /// True when the source rate differed from the target and the audio was resampled.
  bool resampled = false;
};

/// Reads the header of `path`. Throws AudioError ("<path>: <reason>") for a missing, unreadable, empty or
/// non-audio file, a directory, or a header with zero frames, channels or rate.
AudioInfo probe(const std::filesystem::path& path);

/// Number of frames `decode` returns for a file of `info` at the target rate `target_rate`
/// (equal to info.frames when the rates match). Used to plan memory before decoding.
int64_t output_frames(const AudioInfo& info, int target_rate);

/// Decodes `path` to mono float32 at opts.sample_rate. Throws AudioError ("<path>: <reason>") when the file cannot
/// be read, holds fewer frames than its header claims (truncated), contains NaN or Inf samples or samples beyond
/// +-1e6 (float files; they would overflow to Inf when mixed down, resampled or squared), or opts.channel is not a
/// channel of the file. Never returns an empty signal; every sample returned is finite.
///
/// `max_frames` > 0 returns at most that many frames (at opts.sample_rate) and reads the file only as far as they
/// need: the same number of native frames, or, when resampling, their span plus one second of native frames so that
/// the resampler's filter sees the same input as for the whole file. Memory is then bounded by decode_bytes() however
/// long the file is. Truncation, NaN, Inf and out-of-range values are checked only in the part that is read.
DecodedAudio decode(const std::filesystem::path& path, const DecodeOptions& opts, int64_t max_frames = 0);

/// Upper bound, in bytes, of the sample buffers decode(path, opts, max_frames) holds at once for a file of `info`
/// (the read chunk of every channel, the mono signal at the native rate and the resampled one).
int64_t decode_bytes(const AudioInfo& info, const DecodeOptions& opts, int64_t max_frames = 0);

}  // namespace melforge::audio
