// libsndfile decoding and soxr resampling behind kernels/audio/decode.h.
#include "audio/decode.h"

#include <fcntl.h>
#include <sndfile.h>
#include <soxr.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>

#include <boost/program_options.hpp>

#include "melforge/common/errors.h"

namespace melforge::audio {
namespace {

namespace fs = std::filesystem;

/// Bytes of interleaved float32 read from libsndfile per call, whatever the channel count (a header may claim 1,024
/// channels: a chunk of 65,536 frames was then 256 MiB).
constexpr int64_t kReadChunkBytes = int64_t{256} << 10;
/// Output samples soxr writes per soxr_process call.
constexpr size_t kResampleChunkFrames = size_t{1} << 14;
/// soxr's own memory while it resamples a stream (filter tables, FFT buffers and the input it holds back): at most
/// 560 KiB measured with 64 Ki-sample pushes for rates from 1 kHz to 192 kHz, both ways; reserved with margin.
constexpr int64_t kResamplerStateBytes = int64_t{1} << 20;
/// Largest number of frames decode() reserves up front from the header's claim; a longer file grows the buffer as it
/// is read, so a header claiming an absurd length cannot trigger a huge allocation by itself.
constexpr int64_t kMaxReserveFrames = int64_t{1} << 24;
/// Largest sample magnitude accepted (float and double files; PCM is always within [-1, 1]). Larger finite values
/// would overflow to Inf in the mix-down, the resampler or the power spectrum (found by tests/fuzz/fuzz_decode).
constexpr float kMaxAbsSample = 1e6f;

[[noreturn]] void fail(const fs::path& path, const std::string& reason) {
  throw AudioError(path.string() + ": " + reason);
}

/// Owns a POSIX file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  /// The descriptor, -1 when none.
  int get() const { return fd_; }

 private:
  int fd_;
};

/// Owns a libsndfile handle.
class SndFile {
 public:
  explicit SndFile(SNDFILE* handle) : handle_(handle) {}
  ~SndFile() {
    if (handle_ != nullptr) sf_close(handle_);
  }
  SndFile(const SndFile&) = delete;
  SndFile& operator=(const SndFile&) = delete;
  /// The handle, never null once constructed by `OpenAudio`.
  SNDFILE* get() const { return handle_; }

 private:
  SNDFILE* handle_;
};

std::string major_name(int format) {
  switch (format & SF_FORMAT_TYPEMASK) {
    case SF_FORMAT_WAV: return "WAV";
    case SF_FORMAT_AIFF: return "AIFF";
    case SF_FORMAT_AU: return "AU";
    case SF_FORMAT_RAW: return "RAW";
    case SF_FORMAT_PAF: return "PAF";
    case SF_FORMAT_SVX: return "SVX";
    case SF_FORMAT_NIST: return "NIST";
    case SF_FORMAT_VOC: return "VOC";
    case SF_FORMAT_IRCAM: return "IRCAM";
    case SF_FORMAT_W64: return "W64";
    case SF_FORMAT_MAT4: return "MAT4";
    case SF_FORMAT_MAT5: return "MAT5";
    case SF_FORMAT_PVF: return "PVF";
    case SF_FORMAT_XI: return "XI";
    case SF_FORMAT_HTK: return "HTK";
    case SF_FORMAT_SDS: return "SDS";
    case SF_FORMAT_AVR: return "AVR";
    case SF_FORMAT_WAVEX: return "WAVEX";
    case SF_FORMAT_SD2: return "SD2";
    case SF_FORMAT_FLAC: return "FLAC";
    case SF_FORMAT_CAF: return "CAF";
    case SF_FORMAT_WVE: return "WVE";
    case SF_FORMAT_OGG: return "OGG";
    case SF_FORMAT_MPC2K: return "MPC2K";
    case SF_FORMAT_RF64: return "RF64";
    case SF_FORMAT_MPEG: return "MPEG";
    default: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "MAJOR_0x%06X", static_cast<unsigned>(format & SF_FORMAT_TYPEMASK));
  return buf;
}

std::string subtype_name(int format) {
  switch (format & SF_FORMAT_SUBMASK) {
    case SF_FORMAT_PCM_S8: return "PCM_S8";
    case SF_FORMAT_PCM_16: return "PCM_16";
    case SF_FORMAT_PCM_24: return "PCM_24";
    case SF_FORMAT_PCM_32: return "PCM_32";
    case SF_FORMAT_PCM_U8: return "PCM_U8";
    case SF_FORMAT_FLOAT: return "FLOAT";
    case SF_FORMAT_DOUBLE: return "DOUBLE";
    case SF_FORMAT_ULAW: return "ULAW";
    case SF_FORMAT_ALAW: return "ALAW";
    case SF_FORMAT_IMA_ADPCM: return "IMA_ADPCM";
    case SF_FORMAT_MS_ADPCM: return "MS_ADPCM";
    case SF_FORMAT_GSM610: return "GSM610";
    case SF_FORMAT_VOX_ADPCM: return "VOX_ADPCM";
    case SF_FORMAT_NMS_ADPCM_16: return "NMS_ADPCM_16";
    case SF_FORMAT_NMS_ADPCM_24: return "NMS_ADPCM_24";
    case SF_FORMAT_NMS_ADPCM_32: return "NMS_ADPCM_32";
    case SF_FORMAT_G721_32: return "G721_32";
    case SF_FORMAT_G723_24: return "G723_24";
    case SF_FORMAT_G723_40: return "G723_40";
    case SF_FORMAT_DWVW_12: return "DWVW_12";
    case SF_FORMAT_DWVW_16: return "DWVW_16";
    case SF_FORMAT_DWVW_24: return "DWVW_24";
    case SF_FORMAT_DWVW_N: return "DWVW_N";
    case SF_FORMAT_DPCM_8: return "DPCM_8";
    case SF_FORMAT_DPCM_16: return "DPCM_16";
    case SF_FORMAT_VORBIS: return "VORBIS";
    case SF_FORMAT_OPUS: return "OPUS";
    case SF_FORMAT_ALAC_16: return "ALAC_16";
    case SF_FORMAT_ALAC_20: return "ALAC_20";
    case SF_FORMAT_ALAC_24: return "ALAC_24";
    case SF_FORMAT_ALAC_32: return "ALAC_32";
    case SF_FORMAT_MPEG_LAYER_I: return "MPEG_LAYER_I";
    case SF_FORMAT_MPEG_LAYER_II: return "MPEG_LAYER_II";
    case SF_FORMAT_MPEG_LAYER_III: return "MPEG_LAYER_III";
    default: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "SUBTYPE_0x%04X", static_cast<unsigned>(format & SF_FORMAT_SUBMASK));
  return buf;
}

/// An audio file opened for reading, with its header checked. The descriptor outlives the libsndfile handle
/// (members are destroyed in reverse order), and both are released on every path, exceptions included.
struct OpenAudio {
  /// Opens `path` and checks it, throwing AudioError with the reason.
  explicit OpenAudio(const fs::path& path);

  /// The descriptor opened by us; libsndfile reads through it but does not own it.
  Fd fd;
  /// libsndfile's view of the header, filled when `snd` is opened (so declared before it).
  SF_INFO sf_info{};
  /// libsndfile's handle on `fd`.
  SndFile snd;
  /// What the header says.
  AudioInfo info;

 private:
  static int open_checked(const fs::path& path);
  static SNDFILE* sf_open_checked(const fs::path& path, int fd, SF_INFO& sf_info);
};

/// Opens `path` read-only and returns the descriptor, mapping errno to a reason. O_NONBLOCK keeps a FIFO from
/// blocking the open until a writer appears; it is cleared in `sf_open_checked` once the file is known to be regular.
int OpenAudio::open_checked(const fs::path& path) {
  if (path.empty()) fail(path, "empty path");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    switch (err) {
      case ENOENT: fail(path, "no such file");
      case EACCES: fail(path, "permission denied");
      case ENOTDIR: fail(path, "no such file (a parent is not a directory)");
      case ELOOP: fail(path, "too many levels of symbolic links");
      default: fail(path, std::string("cannot open: ") + std::strerror(err));
    }
  }
  return fd;
}

/// libsndfile reads our descriptor through these virtual I/O callbacks, so it can never close it: sf_open_fd closes
/// the descriptor itself when the open fails, even with close_desc false, and the second close by our Fd then hits
/// whatever file another thread had just opened under the same number.
int vio_fd(void* user) { return static_cast<int>(reinterpret_cast<intptr_t>(user)); }
sf_count_t vio_filelen(void* user) {
  struct stat st {};
  return ::fstat(vio_fd(user), &st) == 0 ? static_cast<sf_count_t>(st.st_size) : -1;
}
sf_count_t vio_seek(sf_count_t offset, int whence, void* user) { return ::lseek(vio_fd(user), offset, whence); }
sf_count_t vio_read(void* ptr, sf_count_t count, void* user) {
  auto* out = static_cast<char*>(ptr);
  sf_count_t done = 0;
  while (done < count) {
    const ssize_t n = ::read(vio_fd(user), out + done, static_cast<size_t>(count - done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += n;
  }
  return done;
}
sf_count_t vio_write(const void*, sf_count_t, void*) { return 0; }
sf_count_t vio_tell(void* user) { return ::lseek(vio_fd(user), 0, SEEK_CUR); }
SF_VIRTUAL_IO kFdVirtualIo = {vio_filelen, vio_seek, vio_read, vio_write, vio_tell};

/// libsndfile keeps the error of a failed sf_open in one process-wide variable, which every sf_open clears when it
/// starts: read with sf_strerror(nullptr) while another thread opened a file, a skip reason showed that file's text
/// ("No Error."). Every open holds this lock shared; a failed open is repeated with it held exclusively, so that no
/// other open runs between the failure and sf_strerror(nullptr). Successful opens still run in parallel.
std::shared_mutex g_sf_open_mutex;

/// sf_open_virtual on `fd` from its first byte.
SNDFILE* open_virtual(int fd, SF_INFO& sf_info) {
  ::lseek(fd, 0, SEEK_SET);
  sf_info = SF_INFO{};
  return sf_open_virtual(&kFdVirtualIo, SFM_READ, &sf_info, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
}

/// Rejects directories, non-regular and zero-byte files, then lets libsndfile read `fd` through virtual I/O (it
/// never owns or closes the descriptor). On failure the reason is libsndfile's message for this file (see
/// g_sf_open_mutex).
SNDFILE* OpenAudio::sf_open_checked(const fs::path& path, int fd, SF_INFO& sf_info) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  if (st.st_size == 0) fail(path, "empty file");
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  }
  {
    const std::shared_lock shared(g_sf_open_mutex);
    if (SNDFILE* handle = open_virtual(fd, sf_info)) return handle;
  }
  std::string reason;
  {
    const std::unique_lock exclusive(g_sf_open_mutex);
    if (SNDFILE* handle = open_virtual(fd, sf_info)) return handle;
    reason = sf_strerror(nullptr);
  }
  fail(path, "not an audio file: " + reason);
}

OpenAudio::OpenAudio(const fs::path& path)
    : fd(open_checked(path)), snd(sf_open_checked(path, fd.get(), sf_info)) {
  if (sf_info.channels <= 0) fail(path, "header gives no channels");
  if (sf_info.samplerate <= 0) fail(path, "header gives no sample rate");
  if (sf_info.frames <= 0) fail(path, "no audio frames");
  if (sf_info.frames == SF_COUNT_MAX) fail(path, "header does not give the number of frames (stream cut short?)");
  info.frames = sf_info.frames;
  info.sample_rate = sf_info.samplerate;
  info.channels = sf_info.channels;
  info.format = major_name(sf_info.format) + " " + subtype_name(sf_info.format);
}

/// Receives the mono signal at the target rate, in consecutive pieces (pointer, count).
using MonoSink = std::function<void(const float*, int64_t)>;

/// Streams mono float32 through soxr (SOXR_HQ: 20-bit precision, linear phase, delay removed) from `in_rate` to
/// `out_rate`, a read chunk at a time: soxr keeps its filter state and the input not yet used, and each push hands
/// every output sample it can already compute to the sink, kResampleChunkFrames at a time. The output equals
/// soxr_oneshot's on the whole input: soxr's result does not depend on how the input is cut.
class Resampler {
 public:
  Resampler(const fs::path& path, int in_rate, int out_rate) : path_(path), out_(kResampleChunkFrames) {
    const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, SOXR_LINEAR_PHASE);
    const soxr_runtime_spec_t runtime = soxr_runtime_spec(1);
    soxr_error_t err = nullptr;
    soxr_ = soxr_create(in_rate, out_rate, 1, &err, &io, &quality, &runtime);
    if (err != nullptr || soxr_ == nullptr)
      fail(path_, std::string("resampling failed: ") + (err != nullptr ? err : "soxr_create"));
  }
  ~Resampler() { soxr_delete(soxr_); }
  Resampler(const Resampler&) = delete;
  Resampler& operator=(const Resampler&) = delete;

  /// Adds `n` input samples and passes on the output they complete.
  void push(const float* in, int64_t n, const MonoSink& sink) { drain(in, static_cast<size_t>(n), sink); }
  /// Ends the input (soxr pads it with silence) and passes on the rest of the output.
  void flush(const MonoSink& sink) { drain(nullptr, 0, sink); }

 private:
  /// One soxr_process call with the input, then calls without new input while the output buffer comes back full.
  void drain(const float* in, size_t n, const MonoSink& sink) {
    size_t got = 0;
    do {
      const soxr_error_t err = soxr_process(soxr_, in, n, nullptr, out_.data(), out_.size(), &got);
      if (err != nullptr) fail(path_, std::string("resampling failed: ") + err);
      if (got > 0) sink(out_.data(), static_cast<int64_t>(got));
      n = 0;
    } while (got == out_.size() || (in == nullptr && got > 0));
  }

  const fs::path& path_;
  soxr_t soxr_ = nullptr;
  std::vector<float> out_;
};

/// Native frames read from libsndfile per call for a file of `channels` channels: kReadChunkBytes of interleaved
/// float32, at least one frame.
int64_t chunk_frames(int channels) {
  return std::max<int64_t>(1, kReadChunkBytes / (static_cast<int64_t>(sizeof(float)) * std::max(channels, 1)));
}

/// Throws AudioError for the first sample of `frames` interleaved frames (the first at frame `first` of the file)
/// that is NaN, Inf or beyond +-kMaxAbsSample.
void check_samples(const fs::path& path, const float* data, int64_t frames, int channels, int64_t first) {
  for (int64_t f = 0; f < frames; ++f) {
    const float* frame = data + f * channels;
    for (int c = 0; c < channels; ++c) {
      if (std::fabs(frame[c]) <= kMaxAbsSample) continue;
      const std::string where = " at frame " + std::to_string(first + f) + ", channel " + std::to_string(c) +
                                " (sample index " + std::to_string((first + f) * channels + c) + ")";
      if (!std::isfinite(frame[c])) fail(path, std::string(std::isnan(frame[c]) ? "NaN" : "Inf") + " sample" + where);
      fail(path,
           "sample value " + std::to_string(frame[c]) + where + " is beyond +-1e6 (audio is expected in [-1, 1])");
    }
  }
}

/// Writes the mean of the channels (channel < 0) or `channel` alone of `frames` interleaved frames to `mono`.
void mix_down(const float* data, int64_t frames, int channels, int channel, float* mono) {
  const float inv_channels = 1.0f / static_cast<float>(channels);
  for (int64_t f = 0; f < frames; ++f) {
    const float* frame = data + f * channels;
    if (channel >= 0) {
      mono[f] = frame[channel];
      continue;
    }
    float sum = 0.0f;
    for (int c = 0; c < channels; ++c) sum += frame[c];
    mono[f] = sum * inv_channels;
  }
}

/// Reads the first `limit` frames (all of them when the file is shorter) of `file` a chunk of at most kReadChunkBytes
/// at a time, checks that every sample of every channel is finite and within +-kMaxAbsSample, and hands the mean of
/// the channels (channel < 0) or `channel` alone to `sink`, resampled to `target_rate` through a Resampler when the
/// file's rate differs (flushed at the end). No buffer grows with the file: the chunk, its mono mix and soxr's state.
/// SFC_SET_NORM_FLOAT (libsndfile's default, set explicitly) maps integer PCM of b bits to k / 2^(b-1), in [-1, 1)
/// (32-bit values near full scale round to 1.0f); float and double data are returned unscaled.
/// (SFC_SET_SCALE_FLOAT_INT_READ concerns the other direction, float files read into integer buffers, so it plays
/// no part here.) Fewer frames than the header claims is an error: this happens for compressed streams cut short
/// (FLAC). A WAV whose data chunk claims more bytes than the file holds is not seen as truncated: libsndfile's header
/// already clamps the frame count to the complete frames present (streaming writers leave such sizes in valid
/// files), and exactly those frames are decoded.
class MonoReader {
 public:
  MonoReader(const fs::path& path, OpenAudio& file, int channel, int target_rate, int64_t limit)
      : path_(path), file_(file), channel_(channel), claimed_(std::min(file.info.frames, limit)) {
    sf_command(file.snd.get(), SFC_SET_NORM_FLOAT, nullptr, SF_TRUE);
    const int64_t chunk = std::min(chunk_frames(file.info.channels), claimed_);
    interleaved_.resize(static_cast<size_t>(chunk * file.info.channels));
    mono_.resize(static_cast<size_t>(chunk));
    if (file.info.sample_rate != target_rate) resampler_.emplace(path, file.info.sample_rate, target_rate);
  }
  MonoReader(const MonoReader&) = delete;
  MonoReader& operator=(const MonoReader&) = delete;

  /// Reads one chunk, or at the end flushes the resampler, and hands the output to `sink`; false once all of it was
  /// handed on. Throws AudioError as stream_mono.
  bool step(const MonoSink& sink) {
    if (done_ < claimed_) {
      read_chunk(sink);
      return true;
    }
    if (resampler_ && !flushed_) {
      resampler_->flush(sink);
      flushed_ = true;
      return true;
    }
    return false;
  }

 private:
  void read_chunk(const MonoSink& sink) {
    SNDFILE* snd = file_.snd.get();
    const int channels = file_.info.channels;
    const sf_count_t want = std::min<sf_count_t>(static_cast<sf_count_t>(mono_.size()), claimed_ - done_);
    const sf_count_t got = sf_readf_float(snd, interleaved_.data(), want);
    if (got > 0) {
      check_samples(path_, interleaved_.data(), got, channels, done_);
      mix_down(interleaved_.data(), got, channels, channel_, mono_.data());
      if (resampler_) resampler_->push(mono_.data(), got, sink);
      else sink(mono_.data(), got);
      done_ += got;
    }
    if (got < want) {
      std::string reason = "truncated: header claims " + std::to_string(claimed_) + " frames, read " +
                           std::to_string(done_);
      if (sf_error(snd) != SF_ERR_NO_ERROR) reason += " (" + std::string(sf_strerror(snd)) + ")";
      fail(path_, reason);
    }
  }

  const fs::path& path_;
  OpenAudio& file_;
  const int channel_;
  const int64_t claimed_;
  int64_t done_ = 0;
  bool flushed_ = false;
  std::vector<float> interleaved_;
  std::vector<float> mono_;
  std::optional<Resampler> resampler_;
};

/// Hands the first `limit` frames of `file` to `sink` a MonoReader step at a time.
void stream_mono(const fs::path& path, OpenAudio& file, int channel, int target_rate, int64_t limit,
                 const MonoSink& sink) {
  MonoReader reader(path, file, channel, target_rate, limit);
  while (reader.step(sink)) {
  }
}

/// Native frames decode() reads for `max_frames` output frames (0: all): see decode().
int64_t input_frames(const AudioInfo& info, int target_rate, int64_t max_frames) {
  if (max_frames <= 0) return info.frames;
  if (info.sample_rate == target_rate) return std::min(info.frames, max_frames);
  const int64_t src = info.sample_rate;
  const int64_t span =
      max_frames / target_rate * src + ((max_frames % target_rate) * src + target_rate - 1) / target_rate;
  return std::min(info.frames, span + src);
}

}  // namespace

void add_options(boost::program_options::options_description& desc, DecodeOptions& opts) {
  namespace po = boost::program_options;
  desc.add_options()("channel", po::value<int>(&opts.channel)->default_value(opts.channel),
                     "channel to keep (0-based); -1 averages all channels to mono");
}

AudioInfo probe(const std::filesystem::path& path) { return OpenAudio(path).info; }

std::string resampler_version() { return soxr_version(); }

/// floor((frames * target_rate + sample_rate / 2) / sample_rate), i.e. frames * target_rate / sample_rate rounded to
/// the nearest integer with halves up (for an even sample_rate), and at least 1 for a non-empty file so that decode
/// never returns an empty signal. Computed without overflow for any int64 frame count that fits the result.
int64_t output_frames(const AudioInfo& info, int target_rate) {
  if (info.frames <= 0) return 0;
  if (target_rate <= 0 || info.sample_rate <= 0) {
    throw InvalidArgument("output_frames: sample rates must be positive (file " + std::to_string(info.sample_rate) +
                          " Hz, target " + std::to_string(target_rate) + " Hz)");
  }
  if (info.sample_rate == target_rate) return info.frames;
  const int64_t src = info.sample_rate;
  const int64_t dst = target_rate;
  const int64_t whole = info.frames / src;
  const int64_t rest = info.frames % src;
  const int64_t frames = whole * dst + (rest * dst + src / 2) / src;
  return std::max<int64_t>(1, frames);
}

int64_t decode_bytes(const AudioInfo& info, const DecodeOptions& opts, int64_t max_frames) {
  const int64_t in = std::max<int64_t>(1, input_frames(info, opts.sample_rate, max_frames));
  const int64_t chunk = std::min(chunk_frames(info.channels), in);
  int64_t bytes = chunk * (std::max(info.channels, 1) + 1) * static_cast<int64_t>(sizeof(float));
  if (info.sample_rate != opts.sample_rate)
    bytes += static_cast<int64_t>(kResampleChunkFrames * sizeof(float)) + kResamplerStateBytes;
  return bytes;
}

namespace {

/// One decode: the checked options, the open file and the length of its signal at the target rate, known before any
/// audio is read.
class Decoder {
 public:
  /// Checks `opts` (InvalidArgument), opens `path` and checks opts.channel against it (AudioError).
  Decoder(const fs::path& path, const DecodeOptions& opts, int64_t max_frames)
      : path_(path), opts_(checked(opts)), file_(path) {
    if (opts.channel >= file_.info.channels) {
      fail(path, "channel " + std::to_string(opts.channel) + " requested but the file has " +
                     std::to_string(file_.info.channels) + (file_.info.channels == 1 ? " channel" : " channels"));
    }
    result_.info = file_.info;
    result_.resampled = file_.info.sample_rate != opts.sample_rate;
    part_ = file_.info;
    part_.frames = input_frames(file_.info, opts.sample_rate, max_frames);
    result_.frames = result_.resampled ? output_frames(part_, opts.sample_rate) : part_.frames;
  }
  /// The header, whether the audio is resampled, and `frames`: the length of the signal stream() produces (the
  /// native frames read, or output_frames of them), before any cut to max_frames.
  const DecodedInto& result() const { return result_; }
  /// Streams the signal to `sink` (stream_mono); soxr may hand on a few samples past result().frames.
  void stream(const MonoSink& sink) { stream_mono(path_, file_, opts_.channel, opts_.sample_rate, part_.frames, sink); }
  /// A reader of the same signal a step at a time (it refers to this Decoder, which must outlive it).
  std::unique_ptr<MonoReader> reader() {
    return std::make_unique<MonoReader>(path_, file_, opts_.channel, opts_.sample_rate, part_.frames);
  }

 private:
  static const DecodeOptions& checked(const DecodeOptions& opts) {
    if (opts.sample_rate <= 0)
      throw InvalidArgument("decode: target sample rate must be positive, got " + std::to_string(opts.sample_rate));
    if (opts.channel < -1)
      throw InvalidArgument("decode: channel must be -1 (mix down) or a 0-based channel, got " +
                            std::to_string(opts.channel));
    return opts;
  }

  const fs::path& path_;
  const DecodeOptions opts_;
  OpenAudio file_;
  AudioInfo part_;
  DecodedInto result_;
};

}  // namespace

DecodedInto decode_to(const std::filesystem::path& path, const DecodeOptions& opts, std::span<float> dst) {
  if (dst.empty()) throw InvalidArgument("decode_to: empty destination for " + path.string());
  const auto capacity = static_cast<int64_t>(dst.size());
  Decoder decoder(path, opts, capacity);
  int64_t written = 0;
  decoder.stream([&](const float* samples, int64_t n) {
    const int64_t take = std::min(n, capacity - written);
    if (take <= 0) return;
    std::memcpy(dst.data() + written, samples, static_cast<size_t>(take) * sizeof(float));
    written += take;
  });
  DecodedInto out = decoder.result();
  out.frames = std::min(out.frames, capacity);
  if (written < out.frames) std::fill(dst.begin() + written, dst.begin() + out.frames, 0.0f);
  return out;
}

DecodedAudio decode(const std::filesystem::path& path, const DecodeOptions& opts, int64_t max_frames) {
  Decoder decoder(path, opts, max_frames);
  const DecodedInto& d = decoder.result();
  const int64_t keep = max_frames > 0 ? std::min(d.frames, max_frames) : d.frames;
  DecodedAudio out;
  out.info = d.info;
  out.resampled = d.resampled;
  out.samples.reserve(static_cast<size_t>(max_frames > 0 ? keep : std::min(keep, kMaxReserveFrames)));
  decoder.stream([&](const float* samples, int64_t n) {
    const int64_t take = std::min(n, keep - static_cast<int64_t>(out.samples.size()));
    if (take > 0) out.samples.insert(out.samples.end(), samples, samples + take);
  });
  out.samples.resize(static_cast<size_t>(keep), 0.0f);
  return out;
}

struct DecodeStream::Impl {
  Impl(const fs::path& p, const DecodeOptions& opts) : path(p), decoder(path, opts, 0), reader(decoder.reader()) {}
  const fs::path path;
  Decoder decoder;
  std::unique_ptr<MonoReader> reader;
  /// Output of the last step not yet read, from `taken`.
  std::vector<float> pending;
  size_t taken = 0;
  /// Samples given so far.
  int64_t given = 0;
  bool ended = false;
};

DecodeStream::DecodeStream(const std::filesystem::path& path, const DecodeOptions& opts)
    : impl_(std::make_unique<Impl>(path, opts)) {}

DecodeStream::~DecodeStream() = default;

const DecodedInto& DecodeStream::info() const { return impl_->decoder.result(); }

int64_t DecodeStream::read(std::span<float> dst) {
  Impl& s = *impl_;
  const int64_t total = s.decoder.result().frames;
  const int64_t want = std::min(static_cast<int64_t>(dst.size()), total - s.given);
  int64_t n = 0;
  const MonoSink append = [&s](const float* samples, int64_t count) {
    s.pending.insert(s.pending.end(), samples, samples + count);
  };
  while (n < want) {
    if (s.taken < s.pending.size()) {
      const int64_t take = std::min(want - n, static_cast<int64_t>(s.pending.size() - s.taken));
      std::memcpy(dst.data() + n, s.pending.data() + s.taken, static_cast<size_t>(take) * sizeof(float));
      s.taken += static_cast<size_t>(take);
      n += take;
      continue;
    }
    s.pending.clear();
    s.taken = 0;
    if (s.ended || !s.reader->step(append)) {
      s.ended = true;
      std::fill(dst.begin() + n, dst.begin() + want, 0.0f);
      n = want;
    }
  }
  s.given += n;
  return n;
}

}  // namespace melforge::audio
