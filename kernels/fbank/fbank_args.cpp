#include "fbank/fbank_args.h"

#include <array>
#include <charconv>
#include <cmath>
#include <istream>
#include <ostream>
#include <sstream>
#include <string_view>
#include <utility>

#include <boost/program_options.hpp>

#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "mel/mel_args.h"

namespace melforge::fbank {
namespace {

namespace po = boost::program_options;

constexpr std::array<std::pair<KaldiWindow, std::string_view>, 5> kWindows{{{KaldiWindow::povey, "povey"},
                                                                            {KaldiWindow::hamming, "hamming"},
                                                                            {KaldiWindow::hanning, "hanning"},
                                                                            {KaldiWindow::rectangular, "rectangular"},
                                                                            {KaldiWindow::blackman, "blackman"}}};

/// Shortest decimal spelling that reads back as the same double.
std::string format_double(double v) {
  std::array<char, 40> buf{};
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), result.ptr);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument("fbank parameters: " + message);
}

/// Samples of `ms` milliseconds at `sample_rate`, as torchaudio's int(sample_frequency * ms * 0.001).
int samples_of(int sample_rate, double ms) {
  const double v = static_cast<double>(sample_rate) * ms * 0.001;
  if (!std::isfinite(v) || v < 0 || v > 2e9) return -1;
  return static_cast<int>(v);
}

}  // namespace

std::string to_string(KaldiWindow w) {
  for (const auto& [value, name] : kWindows)
    if (value == w) return std::string(name);
  return "?";
}

KaldiWindow parse_kaldi_window(const std::string& s) {
  const std::string lower = ascii_lower(s);
  std::string accepted;
  for (const auto& [value, name] : kWindows) {
    if (name == lower) return value;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  }
  throw InvalidArgument("invalid window_type '" + s + "' (accepted: " + accepted + ")");
}

std::istream& operator>>(std::istream& in, KaldiWindow& w) {
  std::string token;
  if (in >> token) w = parse_kaldi_window(token);
  return in;
}

std::ostream& operator<<(std::ostream& out, KaldiWindow w) { return out << to_string(w); }

int FbankArgs::window_size(int sample_rate) const { return samples_of(sample_rate, frame_length); }

int FbankArgs::window_shift(int sample_rate) const { return samples_of(sample_rate, frame_shift); }

int FbankArgs::padded_window_size(int sample_rate) const {
  const int w = window_size(sample_rate);
  if (!round_to_power_of_two || w <= 1) return w;
  int p = 1;
  while (p < w && p < (1 << 30)) p <<= 1;
  return p;
}

double FbankArgs::effective_high_freq(int sample_rate) const {
  const double nyquist = 0.5 * sample_rate;
  return high_freq <= 0.0 ? high_freq + nyquist : high_freq;
}

int64_t FbankArgs::n_frames(int64_t samples, int sample_rate) const {
  const int64_t window = window_size(sample_rate);
  const int64_t shift = window_shift(sample_rate);
  if (samples < 0 || window < 1 || shift < 1) return 0;
  if (snip_edges) return samples < window ? 0 : 1 + (samples - window) / shift;
  return (samples + shift / 2) / shift;
}

int64_t FbankArgs::frame_start(int64_t t, int sample_rate) const {
  const int64_t shift = window_shift(sample_rate);
  if (snip_edges) return t * shift;
  return t * shift - (window_size(sample_rate) / 2 - shift / 2);
}

void FbankArgs::validate(int sample_rate) const {
  require(sample_rate > 0, "sample_frequency must be > 0, got " + std::to_string(sample_rate));
  require(std::isfinite(frame_length) && frame_length > 0,
          "frame_length must be > 0 ms, got " + format_double(frame_length));
  require(std::isfinite(frame_shift) && frame_shift > 0,
          "frame_shift must be > 0 ms, got " + format_double(frame_shift));
  const int window = window_size(sample_rate);
  require(window >= 2, "frame_length " + format_double(frame_length) + " ms gives " + std::to_string(window) +
                           " samples at " + std::to_string(sample_rate) + " Hz; a frame needs at least 2");
  require(window_shift(sample_rate) >= 1, "frame_shift " + format_double(frame_shift) + " ms gives no sample at " +
                                              std::to_string(sample_rate) + " Hz");
  const int padded = padded_window_size(sample_rate);
  require(padded <= mel::MelArgs::kMaxNfft, "the padded frame of " + std::to_string(padded) +
                                                " samples is above " + std::to_string(mel::MelArgs::kMaxNfft));
  require(padded % 2 == 0, "the padded frame size " + std::to_string(padded) +
                               " must be even (an odd frame_length in samples needs round_to_power_of_two true)");
  require(num_mel_bins > 3, "num_mel_bins must be > 3, got " + std::to_string(num_mel_bins));
  require(num_mel_bins <= padded / 2, "num_mel_bins " + std::to_string(num_mel_bins) + " is more than the " +
                                          std::to_string(padded / 2) + " FFT bins of a " + std::to_string(padded) +
                                          "-sample frame");
  require(std::isfinite(preemphasis_coefficient) && preemphasis_coefficient >= 0 && preemphasis_coefficient <= 1,
          "preemphasis_coefficient must be in [0, 1], got " + format_double(preemphasis_coefficient));
  const double nyquist = 0.5 * sample_rate;
  require(std::isfinite(low_freq) && low_freq >= 0 && low_freq < nyquist,
          "low_freq must be in [0, Nyquist " + format_double(nyquist) + ") Hz, got " + format_double(low_freq));
  const double high = effective_high_freq(sample_rate);
  require(std::isfinite(high_freq) && high > 0 && high <= nyquist,
          "high_freq " + format_double(high_freq) + " gives " + format_double(high) + " Hz, which must be in (0, " +
              format_double(nyquist) + "] (<= 0 means Nyquist + high_freq)");
  require(low_freq < high, "low_freq " + format_double(low_freq) + " Hz must be below high_freq " +
                               format_double(high) + " Hz");
  require(std::isfinite(dither) && dither >= 0, "dither must be >= 0, got " + format_double(dither));
  require(std::isfinite(energy_floor) && energy_floor >= 0,
          "energy_floor must be >= 0, got " + format_double(energy_floor));
  require(std::isfinite(blackman_coeff), "blackman_coeff must be finite");
  require(vtln_warp == 1.0, "vtln_warp " + format_double(vtln_warp) + " is not supported (only 1.0: no warp)");
}

std::string FbankArgs::to_string() const {
  const auto b = [](bool v) { return v ? "true" : "false"; };
  std::ostringstream s;
  s << "num_mel_bins=" << num_mel_bins << " frame_length=" << format_double(frame_length)
    << " frame_shift=" << format_double(frame_shift) << " window_type=" << window_type
    << " blackman_coeff=" << format_double(blackman_coeff)
    << " preemphasis_coefficient=" << format_double(preemphasis_coefficient)
    << " remove_dc_offset=" << b(remove_dc_offset) << " dither=" << format_double(dither)
    << " dither_seed=" << dither_seed << " round_to_power_of_two=" << b(round_to_power_of_two)
    << " snip_edges=" << b(snip_edges) << " low_freq=" << format_double(low_freq)
    << " high_freq=" << format_double(high_freq) << " use_energy=" << b(use_energy) << " raw_energy=" << b(raw_energy)
    << " energy_floor=" << format_double(energy_floor) << " htk_compat=" << b(htk_compat)
    << " use_log_fbank=" << b(use_log_fbank) << " use_power=" << b(use_power)
    << " vtln_warp=" << format_double(vtln_warp) << " subtract_mean=" << b(subtract_mean);
  return s.str();
}

void add_options(po::options_description& desc, FbankArgs& a) {
  const auto d = [](double& field) { return po::value<double>(&field)->default_value(field, format_double(field)); };
  const auto b = [](bool& field) { return po::value<bool>(&field)->default_value(field, field ? "true" : "false"); };
  desc.add_options()
    ("num-mel-bins", po::value<int>(&a.num_mel_bins)->default_value(a.num_mel_bins),
     "fbank: mel bins (columns without the energy); recipes use 80, AST 128")
    ("frame-length", d(a.frame_length), "fbank: frame length, ms")
    ("frame-shift", d(a.frame_shift), "fbank: frame shift, ms")
    ("window-type", po::value<KaldiWindow>(&a.window_type)->default_value(a.window_type),
     "fbank: povey, hamming, hanning, rectangular or blackman")
    ("blackman-coeff", d(a.blackman_coeff), "fbank: blackman window coefficient")
    ("preemphasis-coefficient", d(a.preemphasis_coefficient), "fbank: pre-emphasis in [0, 1]; 0 disables")
    ("remove-dc-offset", b(a.remove_dc_offset), "fbank: subtract each frame's mean (true/false)")
    ("dither", d(a.dither), "fbank: standard deviation of the seeded Gaussian dither; 0 disables")
    ("dither-seed", po::value<uint64_t>(&a.dither_seed)->default_value(a.dither_seed), "fbank: dither seed")
    ("round-to-power-of-two", b(a.round_to_power_of_two), "fbank: zero-pad frames to a power of two (true/false)")
    ("snip-edges", b(a.snip_edges),
     "fbank: true: only whole frames; false: mirrored edges, (n + shift/2)/shift frames")
    ("low-freq", d(a.low_freq), "fbank: lowest mel edge, Hz")
    ("high-freq", d(a.high_freq), "fbank: highest mel edge, Hz; <= 0 means Nyquist + high_freq")
    ("use-energy", b(a.use_energy), "fbank: add the log energy as a column (true/false)")
    ("raw-energy", b(a.raw_energy), "fbank: energy before pre-emphasis and window (true/false)")
    ("energy-floor", d(a.energy_floor), "fbank: floor of the energy (linear); 0 disables")
    ("htk-compat", b(a.htk_compat), "fbank: energy column last (true/false)")
    ("use-log-fbank", b(a.use_log_fbank), "fbank: log of the mel energies (true/false)")
    ("use-power", b(a.use_power), "fbank: power rather than magnitude spectrum (true/false)")
    ("vtln-warp", d(a.vtln_warp), "fbank: VTLN warp factor; only 1.0")
    ("subtract-mean", b(a.subtract_mean), "fbank: subtract each clip's mean over frames (true/false)");
}

}  // namespace melforge::fbank
