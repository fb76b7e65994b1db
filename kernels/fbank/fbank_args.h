#pragma once
/// Parameters of Kaldi's log mel filterbank as torchaudio.compliance.kaldi.fbank names them, with its defaults.
/// The front-end is selected by mel::MelArgs::features; MelArgs::use_fbank copies these into a MelArgs and derives
/// the FFT geometry (docs/FBANK.md).
#include <cstdint>
#include <iosfwd>
#include <string>

namespace boost::program_options {
class options_description;
}

namespace melforge::fbank {

/// Kaldi's window functions (torchaudio's `window_type`); all symmetric (periodic=False) over window_size samples.
/// povey: hann^0.85; hamming: 0.54 - 0.46 cos; hanning: hann; rectangular: 1; blackman: with blackman_coeff.
enum class KaldiWindow { povey, hamming, hanning, rectangular, blackman };

/// Spelling used on the command line, in HDF5 attributes and in JSON: torchaudio's strings.
std::string to_string(KaldiWindow w);
/// Parses a spelling of to_string in any letter case; throws InvalidArgument naming the accepted values.
KaldiWindow parse_kaldi_window(const std::string& s);
std::istream& operator>>(std::istream& in, KaldiWindow& w);
std::ostream& operator<<(std::ostream& out, KaldiWindow w);

/// torchaudio.compliance.kaldi.fbank's parameters (its keyword names and defaults), except the ones that are not a
/// property of the features: `channel` and `min_duration` (the Python function applies them), `sample_frequency`
/// (MelArgs::sample_rate), and vtln_low/vtln_high (only used when vtln_warp != 1, which is refused).
struct FbankArgs {
  /// Mel bins (columns without the energy). torchaudio default 23; recipes use 80 (16 kHz) or 128 (AST).
  int num_mel_bins = 23;
  /// Frame length, milliseconds.
  double frame_length = 25.0;
  /// Frame shift, milliseconds.
  double frame_shift = 10.0;
  /// Window function.
  KaldiWindow window_type = KaldiWindow::povey;
  /// Blackman window coefficient (window_type blackman only).
  double blackman_coeff = 0.42;
  /// Pre-emphasis: x[j] - c * x[j - 1] within each frame (x[-1] = x[0]); 0 disables. In [0, 1].
  double preemphasis_coefficient = 0.97;
  /// Subtract each frame's mean before the energy and the pre-emphasis.
  bool remove_dc_offset = true;
  /// Standard deviation of Gaussian noise added to each frame before everything else; 0 disables. Our noise is
  /// seeded (dither_seed) and reproducible, a function of (seed, frame index in the clip, sample index in the frame),
  /// identical on CPU and CUDA; it is not torch.randn's, so only dither 0 is compared with torchaudio.
  double dither = 0.0;
  /// Seed of the dither noise.
  uint64_t dither_seed = 0;
  /// Zero-pad each frame to the next power of two before the FFT.
  bool round_to_power_of_two = true;
  /// true: only frames that fit in the signal, 1 + (n - window_size) / shift of them; false: (n + shift/2) / shift
  /// frames, the signal mirrored at both edges (the edge sample repeated), as Kaldi.
  bool snip_edges = true;
  /// Lowest mel edge, Hz.
  double low_freq = 20.0;
  /// Highest mel edge, Hz; <= 0 means Nyquist + high_freq (Kaldi's convention: -400 is 400 Hz below Nyquist).
  double high_freq = 0.0;
  /// Add the log energy of each frame as a column (first, or last with htk_compat).
  bool use_energy = false;
  /// Energy measured before pre-emphasis and window (true) or after them, on the padded frame (false).
  bool raw_energy = true;
  /// Floor of the energy, linear (log(energy_floor) floors the log energy); 0 disables.
  double energy_floor = 1.0;
  /// Energy column last instead of first.
  bool htk_compat = false;
  /// log(max(x, FLT_EPSILON)) of the mel energies; false leaves them linear.
  bool use_log_fbank = true;
  /// Power (|X|^2) rather than magnitude spectrum.
  bool use_power = true;
  /// VTLN warp factor; only 1.0 (no warp) is supported.
  double vtln_warp = 1.0;
  /// Subtract each clip's mean over its frames from every column (per utterance, after the log and the energy).
  bool subtract_mean = false;

  /// Window length, samples: int(sample_rate * frame_length * 0.001), evaluated as torchaudio does, in double.
  int window_size(int sample_rate) const;
  /// Frame shift, samples: int(sample_rate * frame_shift * 0.001).
  int window_shift(int sample_rate) const;
  /// FFT size, samples: window_size rounded up to a power of two (round_to_power_of_two), else window_size.
  int padded_window_size(int sample_rate) const;
  /// Output columns: num_mel_bins, plus one with use_energy.
  int bins() const { return num_mel_bins + (use_energy ? 1 : 0); }
  /// Highest mel edge after Kaldi's convention (high_freq <= 0: Nyquist + high_freq), Hz.
  double effective_high_freq(int sample_rate) const;
  /// Frames torchaudio gives for `samples` samples: snip_edges ? (samples < window ? 0 : 1 + (samples - window) /
  /// shift) : (samples + shift / 2) / shift. 0 when the clip gives none.
  int64_t n_frames(int64_t samples, int sample_rate) const;
  /// First sample (in the clip, may be negative with snip_edges false) of frame t: snip_edges ? t * shift : t * shift
  /// - (window_size / 2 - shift / 2).
  int64_t frame_start(int64_t t, int sample_rate) const;
  /// Throws InvalidArgument naming the parameter (torchaudio's name) when one is out of range: num_mel_bins > 3,
  /// window_size >= 2, shift >= 1, padded size even and at most mel::MelArgs::kMaxNfft, preemphasis in [0, 1],
  /// 0 <= low_freq < Nyquist, 0 < effective high < = Nyquist, low < high, dither and energy_floor >= 0 and finite,
  /// vtln_warp == 1, blackman_coeff finite.
  void validate(int sample_rate) const;
  /// One line with every parameter (torchaudio's names), for logs and the filterbank cache key.
  std::string to_string() const;
};

/// Registers the fbank flags bound to `args`, with torchaudio's names dashed (--num-mel-bins, --frame-length,
/// --frame-shift, --window-type, --blackman-coeff, --preemphasis-coefficient, --remove-dc-offset, --dither,
/// --dither-seed, --round-to-power-of-two, --snip-edges, --low-freq, --high-freq, --use-energy, --raw-energy,
/// --energy-floor, --htk-compat, --use-log-fbank, --use-power, --vtln-warp, --subtract-mean); the underscore
/// spellings are read by melforge/common/flags.h. Booleans take true/false.
void add_options(boost::program_options::options_description& desc, FbankArgs& args);

}  // namespace melforge::fbank
