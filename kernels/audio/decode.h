#pragma once
/// Audio decoding through libsndfile, with mix-down or channel selection and resampling through libsoxr.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
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

/// The resampler decode uses for files at another rate, as melforge-build records it in a dataset's root attributes
/// (docs/FORMAT.md): libsoxr, quality SOXR_HQ (20-bit precision), linear phase.
inline constexpr const char* kResampler = "soxr";
inline constexpr const char* kResamplerQuality = "HQ";
inline constexpr const char* kResamplerPhase = "linear";
/// The linked libsoxr's version string (soxr_version(), e.g. "libsoxr-0.1.3").
std::string resampler_version();

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
/// the resampler's filter sees the same input as for the whole file. Truncation, NaN, Inf and out-of-range values are
/// checked only in the part that is read. The file is read, mixed down and resampled a bounded chunk at a time
/// (decode_bytes); the returned vector is the only buffer that grows with the file.
DecodedAudio decode(const std::filesystem::path& path, const DecodeOptions& opts, int64_t max_frames = 0);

/// What decode_to wrote.
struct DecodedInto {
  /// Header of the source file.
  AudioInfo info;
  /// Samples written at the start of the destination: decode(path, opts, dst.size()).samples.size().
  int64_t frames = 0;
  /// True when the source rate differed from the target and the audio was resampled.
  bool resampled = false;
};

/// decode(path, opts, dst.size()) written straight into `dst` (float32 at opts.sample_rate) instead of a vector of
/// its own: the same samples, the same errors, dst[frames, dst.size()) left as it was. Besides `dst` it holds at
/// most decode_bytes(info, opts, dst.size()) bytes of buffers, however long the file. Throws InvalidArgument for an
/// empty `dst`. On AudioError, dst holds part of the signal.
DecodedInto decode_to(const std::filesystem::path& path, const DecodeOptions& opts, std::span<float> dst);

/// decode() read a block at a time on demand: the same samples, in order, read with read(). Besides the caller's
/// buffer it holds the read chunk, its mono mix, soxr's state and the output of one read chunk not yet taken, at
/// most about 1.6 MiB plus (read chunk x rate ratio) samples whatever the file's length (predict's whole-file
/// windows). Errors as decode(), thrown by the constructor (header, channel) or by read() (truncation, NaN, ...).
class DecodeStream {
 public:
  /// Opens `path` and checks `opts` and the channel (throws InvalidArgument or AudioError as decode()).
  DecodeStream(const std::filesystem::path& path, const DecodeOptions& opts);
  ~DecodeStream();
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;
  /// The header, whether the audio is resampled, and `frames`: the samples the stream gives in all
  /// (decode(path, opts).samples.size()), known before any audio is read.
  const DecodedInto& info() const;
  /// Writes the next min(dst.size(), remaining) samples to `dst` and returns their count; 0 at the end.
  int64_t read(std::span<float> dst);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Upper bound, in bytes, of the buffers decode_to(path, opts, dst of max_frames) holds besides `dst` for a file of
/// `info` (decode holds the same plus its result): the interleaved read chunk (at most 256 KiB, whatever the channel
/// count), its mono mix, and when the rates differ soxr's output buffer and state (1 MiB reserved, 560 KiB measured).
/// At most about 1.6 MiB for any file.
int64_t decode_bytes(const AudioInfo& info, const DecodeOptions& opts, int64_t max_frames = 0);

}  // namespace melforge::audio
