#pragma once
/// Parameters of the log-mel spectrogram, compatible with torchaudio.transforms.MelSpectrogram.
#include <cstdint>
#include <iosfwd>
#include <string>

#include "fbank/fbank_args.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::mel {

/// Analysis window. torchaudio's `torch.hann_window(win_length, periodic=True)`.
enum class Window { hann, hamming };
/// How the signal is padded on both sides when `center` is true (torch.stft's `pad_mode`).
enum class PadMode { reflect, constant };
/// Mel scale formula (torchaudio's `mel_scale`).
enum class MelScale { htk, slaney };
/// Filter normalisation (torchaudio's `norm`): none, or slaney area normalisation.
enum class MelNorm { none, slaney };
/// Compression applied to the mel energies.
/// db: (20/power)*log10(max(x, amin)), i.e. torchaudio's AmplitudeToDB('power') for power 2 (top_db none);
/// ln: log(x + log_eps); none: x.
enum class LogMode { db, ln, none };
/// Element type of the stored spectrograms.
enum class DType { float16, float32 };
/// Feature front-end: torchaudio's MelSpectrogram followed by `log` (mel), or Kaldi's filterbank as
/// torchaudio.compliance.kaldi.fbank computes it (fbank; MelArgs::fbank holds its parameters).
enum class Features { mel, fbank };

/// Spelling of each enum value as used on the command line, in HDF5 attributes and in JSON.
std::string to_string(Window v);
std::string to_string(PadMode v);
std::string to_string(MelScale v);
std::string to_string(MelNorm v);
std::string to_string(LogMode v);
std::string to_string(DType v);
std::string to_string(Features v);
/// Parsers for the spellings above, in any letter case (`Slaney`, `HTK`, `Hann`; torchaudio itself is
/// case-sensitive, so every spelling it takes is accepted); throw InvalidArgument naming the accepted values.
Window parse_window(const std::string& s);
PadMode parse_pad_mode(const std::string& s);
MelScale parse_mel_scale(const std::string& s);
MelNorm parse_mel_norm(const std::string& s);
LogMode parse_log_mode(const std::string& s);
DType parse_dtype(const std::string& s);
Features parse_features(const std::string& s);
/// Stream operators so that Boost.Program_options reads and prints the enums.
std::istream& operator>>(std::istream& in, Window& v);
std::istream& operator>>(std::istream& in, PadMode& v);
std::istream& operator>>(std::istream& in, MelScale& v);
std::istream& operator>>(std::istream& in, MelNorm& v);
std::istream& operator>>(std::istream& in, LogMode& v);
std::istream& operator>>(std::istream& in, DType& v);
std::istream& operator>>(std::istream& in, Features& v);
std::ostream& operator<<(std::ostream& out, Window v);
std::ostream& operator<<(std::ostream& out, PadMode v);
std::ostream& operator<<(std::ostream& out, MelScale v);
std::ostream& operator<<(std::ostream& out, MelNorm v);
std::ostream& operator<<(std::ostream& out, LogMode v);
std::ostream& operator<<(std::ostream& out, DType v);
std::ostream& operator<<(std::ostream& out, Features v);

/// Log-mel spectrogram parameters. Field names equal the flag names with underscores, and the HDF5 attribute names.
struct MelArgs {
  /// Sample rate of the audio, Hz. Input files at other rates are resampled to it.
  int sample_rate = 16000;
  /// FFT size, samples. The spectrum has n_fft/2+1 bins.
  int n_fft = 512;
  /// Window length, samples; 0 means n_fft (`--win-length auto`). The window is zero-padded on both sides to n_fft.
  int win_length = 0;
  /// Hop between frames, samples; 0 means win_length/2, torchaudio's default (`--hop-length auto`; the flag
  /// refuses 0).
  int hop_length = 0;
  /// Window function.
  Window window = Window::hann;
  /// Pad the signal by n_fft/2 on both sides so that frame t is centred on sample t*hop_length.
  bool center = true;
  /// Padding used when `center` is true.
  PadMode pad_mode = PadMode::reflect;
  /// Exponent of the magnitude spectrogram: 2 for power, 1 for magnitude. Must be > 0.
  float power = 2.0f;
  /// Number of mel bands.
  int n_mels = 64;
  /// Lowest filter edge, Hz.
  float f_min = 0.0f;
  /// Highest filter edge, Hz; 0 means floor(sample_rate/2), as torchaudio's `float(sample_rate // 2)`.
  float f_max = 0.0f;
  /// Mel scale formula.
  MelScale mel_scale = MelScale::htk;
  /// Filter normalisation.
  MelNorm mel_norm = MelNorm::none;
  /// Compression of the mel energies.
  LogMode log = LogMode::db;
  /// Floor for `log db`: values below amin are clamped to it before the log.
  float amin = 1e-10f;
  /// Offset for `log ln`: log(x + log_eps).
  float log_eps = 1e-6f;
  /// Front-end. With fbank, `fbank` holds the parameters and the fields above that the engines size buffers with
  /// are derived from it by use_fbank (n_fft = padded window, win_length = window, hop_length = shift, n_mels =
  /// fbank.bins() output columns, center false); the mel-only fields (window, pad_mode, power, f_min, f_max,
  /// mel_scale, mel_norm, log, amin, log_eps) are not used.
  Features features = Features::mel;
  /// Kaldi filterbank parameters; used when features is fbank.
  fbank::FbankArgs fbank;

  /// Selects Kaldi's filterbank with `f` at this sample_rate and derives n_fft, win_length, hop_length, n_mels and
  /// center from it. Throws InvalidArgument when `f` is invalid at sample_rate (FbankArgs::validate).
  void use_fbank(const fbank::FbankArgs& f);
  /// Whether the front-end is Kaldi's filterbank.
  bool is_fbank() const { return features == Features::fbank; }

  /// Effective window length, samples.
  int win() const { return win_length > 0 ? win_length : n_fft; }
  /// Effective hop length, samples.
  int hop() const { return hop_length > 0 ? hop_length : win() / 2; }
  /// Effective highest filter edge, Hz.
  float fmax() const { return f_max > 0.0f ? f_max : static_cast<float>(sample_rate / 2); }
  /// Number of one-sided FFT bins: n_fft/2+1.
  int n_freqs() const { return n_fft / 2 + 1; }
  /// Padding added on each side of a segment: n_fft/2 when centred, else 0.
  int pad() const { return center ? n_fft / 2 : 0; }
  /// Number of frames for a segment of `samples` samples (torch.stft's count, or fbank.n_frames); 0 if too short.
  int n_frames(int64_t samples) const;
  /// Frames a whole clip of `samples` samples gets from MelEngine::compute_clips: the count above (as int64), or 1
  /// when that is 0 (the clip is zero-padded to one frame and flagged kClipPaddedToFrame).
  int64_t clip_frames(int64_t samples) const;
  /// Largest n_fft accepted (validate). Bounds the filterbank's size and build time for any accepted n_mels.
  static constexpr int kMaxNfft = 1 << 16;
  /// Throws InvalidArgument when a parameter is out of range (n_fft above kMaxNfft, n_mels above n_fft/2+1, f_max
  /// above Nyquist, mel band edges that coincide). A mel band with no FFT bin is not an error, as in torchaudio:
  /// empty_bands_warning (filterbank.h) gives the warning to show. `segment_samples` > 0 also checks that a segment of
  /// that length gives at least one frame and can be reflect-padded.
  void validate(int64_t segment_samples = 0) const;
  /// One line with every effective parameter, for logs.
  std::string to_string() const;

 private:
  /// validate() for features fbank.
  void validate_fbank(int64_t segment_samples) const;
};

/// Registers the mel flags (--sample-rate, --n-fft, ... --log-eps), bound to the fields of `args`, whose current
/// values are shown as the defaults in --help; torchaudio's names --norm and --window-fn are aliases of --mel-norm
/// and --window (melforge/common/flags.h reads them, and every flag spelled with underscores).
void add_options(boost::program_options::options_description& desc, MelArgs& args);

}  // namespace melforge::mel
