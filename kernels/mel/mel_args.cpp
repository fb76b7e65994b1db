#include "mel/mel_args.h"

#include <algorithm>
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
#include "melforge/common/options.h"
#include "mel/filterbank.h"
#include "mel/mel_math.h"

namespace melforge::mel {
namespace {

namespace po = boost::program_options;

template <class E, std::size_t N>
using Spellings = std::array<std::pair<E, std::string_view>, N>;

constexpr Spellings<Window, 2> kWindow{{{Window::hann, "hann"}, {Window::hamming, "hamming"}}};
constexpr Spellings<PadMode, 2> kPadMode{{{PadMode::reflect, "reflect"}, {PadMode::constant, "constant"}}};
constexpr Spellings<MelScale, 2> kMelScale{{{MelScale::htk, "htk"}, {MelScale::slaney, "slaney"}}};
constexpr Spellings<MelNorm, 2> kMelNorm{{{MelNorm::none, "none"}, {MelNorm::slaney, "slaney"}}};
constexpr Spellings<LogMode, 3> kLogMode{{{LogMode::db, "db"}, {LogMode::ln, "ln"}, {LogMode::none, "none"}}};
constexpr Spellings<DType, 2> kDType{{{DType::float16, "float16"}, {DType::float32, "float32"}}};
constexpr Spellings<Features, 2> kFeatures{{{Features::mel, "mel"}, {Features::fbank, "fbank"}}};

/// Spelling of `v` in `table`.
template <class E, std::size_t N>
std::string spell(const Spellings<E, N>& table, E v) {
  for (const auto& [value, name] : table) {
    if (value == v) return std::string(name);
  }
  return "?";
}

/// Value spelled `s` in `table`, in any letter case (`Slaney`, `HTK`); throws InvalidArgument naming `what` and the
/// accepted spellings.
template <class E, std::size_t N>
E parse(const Spellings<E, N>& table, const std::string& s, std::string_view what) {
  const std::string lower = ascii_lower(s);
  for (const auto& [value, name] : table) {
    if (name == lower) return value;
  }
  std::string accepted;
  for (const auto& [value, name] : table) {
    if (!accepted.empty()) accepted += ", ";
    accepted += name;
  }
  throw InvalidArgument("invalid " + std::string(what) + " '" + s + "' (accepted: " + accepted + ")");
}

/// Reads one whitespace-delimited token and parses it with `parser`; an empty stream sets failbit.
template <class E, class Parser>
std::istream& read_enum(std::istream& in, E& v, Parser parser) {
  std::string token;
  if (in >> token) v = parser(token);
  return in;
}

/// Shortest decimal spelling that reads back as the same float.
std::string format_float(float v) {
  std::array<char, 32> buf{};
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), result.ptr);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument("mel parameters: " + message);
}

}  // namespace

std::string to_string(Window v) { return spell(kWindow, v); }
std::string to_string(PadMode v) { return spell(kPadMode, v); }
std::string to_string(MelScale v) { return spell(kMelScale, v); }
std::string to_string(MelNorm v) { return spell(kMelNorm, v); }
std::string to_string(LogMode v) { return spell(kLogMode, v); }
std::string to_string(DType v) { return spell(kDType, v); }
std::string to_string(Features v) { return spell(kFeatures, v); }

Window parse_window(const std::string& s) { return parse(kWindow, s, "window"); }
PadMode parse_pad_mode(const std::string& s) { return parse(kPadMode, s, "pad mode"); }
MelScale parse_mel_scale(const std::string& s) { return parse(kMelScale, s, "mel scale"); }
MelNorm parse_mel_norm(const std::string& s) { return parse(kMelNorm, s, "mel norm"); }
LogMode parse_log_mode(const std::string& s) { return parse(kLogMode, s, "log mode"); }
DType parse_dtype(const std::string& s) { return parse(kDType, s, "dtype"); }
Features parse_features(const std::string& s) { return parse(kFeatures, s, "features"); }

std::istream& operator>>(std::istream& in, Window& v) { return read_enum(in, v, parse_window); }
std::istream& operator>>(std::istream& in, PadMode& v) { return read_enum(in, v, parse_pad_mode); }
std::istream& operator>>(std::istream& in, MelScale& v) { return read_enum(in, v, parse_mel_scale); }
std::istream& operator>>(std::istream& in, MelNorm& v) { return read_enum(in, v, parse_mel_norm); }
std::istream& operator>>(std::istream& in, LogMode& v) { return read_enum(in, v, parse_log_mode); }
std::istream& operator>>(std::istream& in, DType& v) { return read_enum(in, v, parse_dtype); }
std::istream& operator>>(std::istream& in, Features& v) { return read_enum(in, v, parse_features); }
std::ostream& operator<<(std::ostream& out, Window v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, PadMode v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, MelScale v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, MelNorm v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, LogMode v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, DType v) { return out << to_string(v); }
std::ostream& operator<<(std::ostream& out, Features v) { return out << to_string(v); }

int MelArgs::n_frames(int64_t samples) const {
  if (n_fft < 1 || hop() < 1 || samples < 0) return 0;
  if (is_fbank()) return static_cast<int>(fbank.n_frames(samples, sample_rate));
  return frame_count(samples, n_fft, hop(), pad());
}

int64_t MelArgs::clip_frames(int64_t samples) const {
  if (is_fbank()) return std::max<int64_t>(fbank.n_frames(samples, sample_rate), 1);
  return mel::clip_frames(samples, n_fft, hop(), pad());
}

void MelArgs::use_fbank(const fbank::FbankArgs& f) {
  f.validate(sample_rate);
  features = Features::fbank;
  fbank = f;
  n_fft = f.padded_window_size(sample_rate);
  win_length = f.window_size(sample_rate);
  hop_length = f.window_shift(sample_rate);
  n_mels = f.bins();
  center = false;
}

void MelArgs::validate(int64_t segment_samples) const {
  if (is_fbank()) {
    validate_fbank(segment_samples);
    return;
  }
  require(sample_rate > 0, "sample_rate must be > 0, got " + std::to_string(sample_rate));
  require(n_fft >= 2 && n_fft <= kMaxNfft,
          "n_fft must be in [2, " + std::to_string(kMaxNfft) + "], got " + std::to_string(n_fft));
  require(win_length >= 0 && win_length <= n_fft,
          "win_length must be in [0, n_fft=" + std::to_string(n_fft) + "], got " + std::to_string(win_length));
  require(hop_length >= 0, "hop_length must be >= 0, got " + std::to_string(hop_length));
  require(hop() > 0, "the effective hop (hop_length 0 means win_length/2) is 0 for win_length " +
                         std::to_string(win()) + "; set hop_length");
  require(std::isfinite(power) && power > 0.0f, "power must be > 0, got " + format_float(power));
  require(n_mels >= 1, "n_mels must be >= 1, got " + std::to_string(n_mels));
  require(n_mels <= n_freqs(), "n_mels " + std::to_string(n_mels) + " is too large for n_fft " +
                                   std::to_string(n_fft) + " (at most n_fft/2+1 = " + std::to_string(n_freqs()) + ")");
  const float nyquist = static_cast<float>(sample_rate) / 2.0f;
  require(std::isfinite(f_min) && f_min >= 0.0f, "f_min must be >= 0, got " + format_float(f_min));
  require(std::isfinite(f_max) && f_max >= 0.0f, "f_max must be >= 0 (0 means sample_rate/2), got " +
                                                     format_float(f_max));
  require(fmax() <= nyquist, "f_max " + format_float(fmax()) + " Hz is above the Nyquist frequency " +
                                 format_float(nyquist) + " Hz of --sample-rate " + std::to_string(sample_rate) +
                                 " Hz: lower --f-max or raise --sample-rate");
  if (f_max <= 0.0f && f_min == 0.0f) {
    require(fmax() > 0.0f, "--sample-rate " + std::to_string(sample_rate) + " Hz is too low: f_max is half of it (" +
                               format_float(fmax()) + " Hz, as --f-max 0 means), which must be above f_min 0 Hz " +
                               "for " + std::to_string(n_mels) + " mel bands; raise --sample-rate (e.g. 16000)");
  } else if (f_max <= 0.0f) {
    require(f_min < fmax(), "f_min " + format_float(f_min) + " Hz must be below f_max " + format_float(fmax()) +
                                " Hz, half of --sample-rate " + std::to_string(sample_rate) +
                                " (as --f-max 0 means): lower --f-min or raise --sample-rate");
  }
  require(f_min < fmax(), "f_min " + format_float(f_min) + " Hz must be below f_max " + format_float(fmax()) + " Hz");
  require(std::isfinite(amin) && amin > 0.0f, "amin must be > 0, got " + format_float(amin));
  require(std::isfinite(log_eps) && log_eps > 0.0f, "log_eps must be > 0, got " + format_float(log_eps));
  build_filterbank(*this);
  if (segment_samples > 0) {
    const std::string segment = "a short segment of " + std::to_string(segment_samples) +
                                " samples (--short-seconds x --sample-rate " + std::to_string(sample_rate) + " Hz)";
    require(n_frames(segment_samples) >= 1,
            segment + " gives no frame with --n-fft " + std::to_string(n_fft) +
                (center ? " and centre padding" : " without centre padding") +
                ": raise --short-seconds or --sample-rate, or lower --n-fft");
    if (center && pad_mode == PadMode::reflect) {
      require(segment_samples > pad(), segment + " is too short for reflect padding by n_fft/2 = " +
                                           std::to_string(pad()) + " samples: raise --short-seconds or " +
                                           "--sample-rate, lower --n-fft, or use --pad-mode constant");
    }
  }
}

void MelArgs::validate_fbank(int64_t segment_samples) const {
  require(sample_rate > 0, "sample_rate must be > 0, got " + std::to_string(sample_rate));
  fbank.validate(sample_rate);
  require(n_fft == fbank.padded_window_size(sample_rate) && win_length == fbank.window_size(sample_rate) &&
              hop_length == fbank.window_shift(sample_rate) && n_mels == fbank.bins() && !center,
          "fbank: n_fft, win_length, hop_length, n_mels and center must be those the fbank parameters give "
          "(MelArgs::use_fbank sets them)");
  if (segment_samples > 0) {
    require(n_frames(segment_samples) >= 1,
            "a short segment of " + std::to_string(segment_samples) + " samples gives no fbank frame of " +
                std::to_string(win_length) + " samples (--frame-length " + format_float(float(fbank.frame_length)) +
                " ms): raise --short-seconds or lower --frame-length");
  }
}

std::string MelArgs::to_string() const {
  if (is_fbank()) return "features=fbank sample_rate=" + std::to_string(sample_rate) + " " + fbank.to_string();
  std::ostringstream s;
  s << "sample_rate=" << sample_rate << " n_fft=" << n_fft << " win_length=" << win() << " hop_length=" << hop()
    << " window=" << window << " center=" << (center ? "true" : "false") << " pad_mode=" << pad_mode
    << " power=" << format_float(power) << " n_mels=" << n_mels << " f_min=" << format_float(f_min)
    << " f_max=" << format_float(fmax()) << " mel_scale=" << mel_scale << " mel_norm=" << mel_norm << " log=" << log
    << " amin=" << format_float(amin) << " log_eps=" << format_float(log_eps);
  return s.str();
}

void add_options(po::options_description& desc, MelArgs& args) {
  auto f = [](float& field) { return po::value<float>(&field)->default_value(field, format_float(field)); };
  desc.add_options()
    ("sample-rate", po::value<int>(&args.sample_rate)->default_value(args.sample_rate),
     "sample rate of the spectrogram input, Hz; audio at other rates is resampled")
    ("n-fft", po::value<int>(&args.n_fft)->default_value(args.n_fft), "FFT size, samples (n_fft/2+1 bins)")
    ("win-length",
     po::value<std::string>()
         ->default_value(args.win_length > 0 ? std::to_string(args.win_length) : "auto")
         ->notifier([&args](const std::string& v) { args.win_length = parse_positive_or_auto(v, "--win-length"); }),
     "window length, samples, zero-padded to n_fft; auto means n_fft")
    ("hop-length",
     po::value<std::string>()
         ->default_value(args.hop_length > 0 ? std::to_string(args.hop_length) : "auto")
         ->notifier([&args](const std::string& v) { args.hop_length = parse_positive_or_auto(v, "--hop-length"); }),
     "hop between frames, samples; auto means win_length/2")
    ("window,window-fn", po::value<Window>(&args.window)->default_value(args.window),
     "analysis window: hann or hamming (torchaudio's window_fn)")
    ("center", po::value<bool>(&args.center)->default_value(args.center, args.center ? "true" : "false"),
     "pad n_fft/2 on both sides so that frame t is centred on sample t*hop (true/false)")
    ("pad-mode", po::value<PadMode>(&args.pad_mode)->default_value(args.pad_mode),
     "padding when --center is true: reflect or constant (zeros)")
    ("power", f(args.power), "exponent of the magnitude: 2 for power, 1 for magnitude")
    ("n-mels", po::value<int>(&args.n_mels)->default_value(args.n_mels), "number of mel bands")
    ("f-min", f(args.f_min), "lowest mel filter edge, Hz")
    ("f-max", f(args.f_max), "highest mel filter edge, Hz; 0 means sample_rate/2")
    ("mel-scale", po::value<MelScale>(&args.mel_scale)->default_value(args.mel_scale), "mel formula: htk or slaney")
    ("mel-norm,norm", po::value<MelNorm>(&args.mel_norm)->default_value(args.mel_norm),
     "filter normalisation: none or slaney (area); torchaudio's norm")
    ("log", po::value<LogMode>(&args.log)->default_value(args.log),
     "compression: db ((20/power)*log10(max(x, amin))), ln (log(x + log_eps)) or none")
    ("amin", f(args.amin), "floor applied before the log for --log db")
    ("log-eps", f(args.log_eps), "offset added before the log for --log ln");
}

}  // namespace melforge::mel
