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
#include <limits>
#include <string>
#include <utility>

#include <boost/program_options.hpp>

#include "melforge/common/errors.h"

namespace melforge::audio {
namespace {

namespace fs = std::filesystem;

/// Frames read from libsndfile per call.
constexpr sf_count_t kReadChunkFrames = 1 << 16;
/// Largest number of frames reserved up front from the header's claim; a longer file grows the buffer as it is read,
/// so a header claiming an absurd length cannot trigger a huge allocation by itself.
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

/// Rejects directories, non-regular and zero-byte files, then lets libsndfile read `fd` through virtual I/O (it
/// never owns or closes the descriptor). On failure the reason is libsndfile's message from sf_strerror(nullptr), which reads a process-wide
/// last error: when several threads fail at once the text may belong to another file, the failure never does.
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
  sf_info = SF_INFO{};
  SNDFILE* handle = sf_open_virtual(&kFdVirtualIo, SFM_READ, &sf_info, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  if (handle == nullptr) fail(path, std::string("not an audio file: ") + sf_strerror(nullptr));
  return handle;
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

/// Reads the first `limit` frames (all of them when the file is shorter) of `file` in chunks, checks that every
/// sample of every channel is finite, and returns the mean of the channels (channel < 0) or `channel` alone, [frames]
/// at the native rate; a finite sample beyond +-kMaxAbsSample is an error too. Room for all `limit` frames is
/// reserved up front when `reserve_limit` (the caller bounded them), else for at most kMaxReserveFrames.
/// SFC_SET_NORM_FLOAT (libsndfile's default, set explicitly) maps integer PCM of b bits to k / 2^(b-1), in [-1, 1)
/// (32-bit values near full scale round to 1.0f); float and double data are returned unscaled.
/// (SFC_SET_SCALE_FLOAT_INT_READ concerns the other direction, float files read into integer buffers, so it plays
/// no part here.) Fewer frames than the header
/// claims is an error: this happens for compressed streams cut short (FLAC). A WAV whose data chunk claims more bytes
/// than the file holds is not seen as truncated: libsndfile's header already clamps the frame count to the complete
/// frames present (streaming writers leave such sizes in valid files), and exactly those frames are decoded.
std::vector<float> read_mono(const fs::path& path, OpenAudio& file, int channel, int64_t limit, bool reserve_limit) {
  SNDFILE* snd = file.snd.get();
  const int channels = file.info.channels;
  const int64_t claimed = std::min(file.info.frames, limit);
  sf_command(snd, SFC_SET_NORM_FLOAT, nullptr, SF_TRUE);

  std::vector<float> mono;
  mono.reserve(static_cast<size_t>(reserve_limit ? claimed : std::min(claimed, kMaxReserveFrames)));
  std::vector<float> chunk(static_cast<size_t>(kReadChunkFrames) * static_cast<size_t>(channels));
  const float inv_channels = 1.0f / static_cast<float>(channels);
  int64_t done = 0;
  while (done < claimed) {
    const sf_count_t want = std::min<sf_count_t>(kReadChunkFrames, claimed - done);
    const sf_count_t got = sf_readf_float(snd, chunk.data(), want);
    if (got <= 0) break;
    for (sf_count_t f = 0; f < got; ++f) {
      const float* frame = chunk.data() + static_cast<size_t>(f) * static_cast<size_t>(channels);
      for (int c = 0; c < channels; ++c) {
        if (!(std::fabs(frame[c]) <= kMaxAbsSample)) {
          const std::string where = " at frame " + std::to_string(done + f) + ", channel " + std::to_string(c) +
                                    " (sample index " + std::to_string((done + f) * channels + c) + ")";
          if (!std::isfinite(frame[c]))
            fail(path, std::string(std::isnan(frame[c]) ? "NaN" : "Inf") + " sample" + where);
          fail(path, "sample value " + std::to_string(frame[c]) + where +
                         " is beyond +-1e6 (audio is expected in [-1, 1])");
        }
      }
      if (channel >= 0) {
        mono.push_back(frame[channel]);
      } else {
        float sum = 0.0f;
        for (int c = 0; c < channels; ++c) sum += frame[c];
        mono.push_back(sum * inv_channels);
      }
    }
    done += got;
    if (got < want) break;
  }
  if (done < claimed) {
    std::string reason = "truncated: header claims " + std::to_string(claimed) + " frames, read " +
                         std::to_string(done);
    if (sf_error(snd) != SF_ERR_NO_ERROR) reason += " (" + std::string(sf_strerror(snd)) + ")";
    fail(path, reason);
  }
  return mono;
}

/// Resamples mono `in` from `in_rate` to `out_rate` with soxr (SOXR_HQ: 20-bit precision, linear phase, delay
/// removed) and returns exactly `out_frames` samples. soxr_oneshot itself yields round(in.size() * out_rate / in_rate)
/// samples, which equals `out_frames` (see output_frames) except for inputs of one or two samples that soxr turns into
/// nothing. The output buffer has room for a few extra samples, so a longer result is trimmed to `out_frames`, and a
/// shorter one is zero-extended to it.
std::vector<float> resample(const fs::path& path, const std::vector<float>& in, int in_rate, int out_rate,
                            int64_t out_frames) {
  std::vector<float> out(static_cast<size_t>(out_frames) + 64, 0.0f);
  size_t in_done = 0;
  size_t out_done = 0;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, SOXR_LINEAR_PHASE);
  const soxr_runtime_spec_t runtime = soxr_runtime_spec(1);
  const soxr_error_t err = soxr_oneshot(in_rate, out_rate, 1, in.data(), in.size(), &in_done, out.data(),
                                        out.size(), &out_done, &io, &quality, &runtime);
  if (err != nullptr) fail(path, std::string("resampling failed: ") + err);
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(std::min(out_done, out.size())), out.end(), 0.0f);
  out.resize(static_cast<size_t>(out_frames));
  return out;
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
  const int64_t in = input_frames(info, opts.sample_rate, max_frames);
  int64_t out = 0;
  if (info.sample_rate != opts.sample_rate) {
    AudioInfo part = info;
    part.frames = in;
    out = output_frames(part, opts.sample_rate) + 64;
  }
  const int64_t chunk = int64_t{kReadChunkFrames} * std::max(info.channels, 1);
  return (chunk + in + out) * static_cast<int64_t>(sizeof(float));
}

DecodedAudio decode(const std::filesystem::path& path, const DecodeOptions& opts, int64_t max_frames) {
  if (opts.sample_rate <= 0) {
    throw InvalidArgument("decode: target sample rate must be positive, got " + std::to_string(opts.sample_rate));
  }
  if (opts.channel < -1) {
    throw InvalidArgument("decode: channel must be -1 (mix down) or a 0-based channel, got " +
                          std::to_string(opts.channel));
  }
  OpenAudio file(path);
  if (opts.channel >= file.info.channels) {
    fail(path, "channel " + std::to_string(opts.channel) + " requested but the file has " +
                   std::to_string(file.info.channels) + (file.info.channels == 1 ? " channel" : " channels"));
  }
  DecodedAudio out;
  out.info = file.info;
  const int64_t limit = input_frames(file.info, opts.sample_rate, max_frames);
  out.samples = read_mono(path, file, opts.channel, limit, max_frames > 0);
  if (out.info.sample_rate != opts.sample_rate) {
    AudioInfo part = out.info;
    part.frames = limit;
    out.samples = resample(path, out.samples, out.info.sample_rate, opts.sample_rate,
                           output_frames(part, opts.sample_rate));
    out.resampled = true;
  }
  if (max_frames > 0 && static_cast<int64_t>(out.samples.size()) > max_frames) {
    out.samples.resize(static_cast<size_t>(max_frames));
  }
  return out;
}

}  // namespace melforge::audio
