// The augmentation flags of melforge-build: their parsers, validate() and their registration (augment.h).
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <system_error>

#include <boost/program_options.hpp>

#include "augment/augment.h"
#include "melforge/common/errors.h"
#include "melforge/common/options.h"

namespace melforge::augment {
namespace {

namespace po = boost::program_options;

/// Most augmented copies per file.
constexpr int kMaxCopies = 64;
/// Accepted range of an SNR bound, dB.
constexpr double kMinSnrDb = -60.0;
constexpr double kMaxSnrDb = 120.0;
/// Accepted range of a gain bound, dB.
constexpr double kMinGainDb = -60.0;
constexpr double kMaxGainDb = 30.0;
/// Accepted range of a speed factor.
constexpr double kMinSpeed = 0.5;
constexpr double kMaxSpeed = 2.0;

[[noreturn]] void fail(const std::string& flag, const std::string& message) {
  throw InvalidArgument(flag + ": " + message);
}

/// `text` cut at commas, each part trimmed of spaces; an empty text gives no part.
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  if (text.find_first_not_of(" \t") == std::string::npos) return parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto first = part.find_first_not_of(" \t");
    const auto last = part.find_last_not_of(" \t");
    parts.push_back(first == std::string::npos ? std::string() : part.substr(first, last - first + 1));
  }
  if (text.back() == ',') parts.emplace_back();
  return parts;
}

/// The finite number spelled `text` (the whole of it); throws InvalidArgument naming `flag`.
double parse_number(const std::string& text, const std::string& flag, const std::string& whole) {
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    fail(flag, "'" + text + "' in '" + whole + "' is not a finite number");
  return v;
}

/// "MIN,MAX" with both in [lo, hi] and MIN <= MAX.
std::pair<double, double> parse_range(const std::string& text, const std::string& flag, double lo, double hi) {
  const auto parts = split_commas(text);
  if (parts.size() != 2) fail(flag, "'" + text + "' is not MIN,MAX (two numbers separated by a comma)");
  const double a = parse_number(parts[0], flag, text);
  const double b = parse_number(parts[1], flag, text);
  if (a > b) fail(flag, "MIN " + default_text(a) + " is above MAX " + default_text(b) + " in '" + text + "'");
  if (a < lo || b > hi)
    fail(flag, "'" + text + "' is outside [" + default_text(lo) + ", " + default_text(hi) + "]");
  return {a, b};
}

/// `p` is a probability.
void check_probability(double p, const std::string& flag) {
  if (!(p >= 0.0 && p <= 1.0)) fail(flag, default_text(p) + " is not a probability in [0, 1]");
}

/// A non-empty `dir` is an existing folder.
void check_folder(const std::filesystem::path& dir, const std::string& flag) {
  if (dir.empty()) return;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) fail(flag, "'" + dir.string() + "' is not a folder");
}

}  // namespace

std::pair<double, double> AugmentArgs::snr_range() const {
  return parse_range(snr_db, "--snr-db", kMinSnrDb, kMaxSnrDb);
}

std::pair<double, double> AugmentArgs::gain_range() const {
  return parse_range(gain_db, "--gain-db", kMinGainDb, kMaxGainDb);
}

std::vector<double> AugmentArgs::speed_list() const {
  const auto parts = split_commas(speed);
  if (parts.empty()) fail("--speed", "no speed factor given (e.g. 0.9,1.0,1.1)");
  std::vector<double> out;
  for (const auto& p : parts) {
    const double v = parse_number(p, "--speed", speed);
    if (v < kMinSpeed || v > kMaxSpeed)
      fail("--speed", "factor " + p + " is outside [" + default_text(kMinSpeed) + ", " + default_text(kMaxSpeed) + "]");
    out.push_back(v);
  }
  return out;
}

std::array<bool, 3> AugmentArgs::split_mask() const {
  std::array<bool, 3> mask{};
  const auto parts = split_commas(splits);
  if (parts.empty()) fail("--augment-splits", "no split given (any of train,val,test)");
  for (const auto& p : parts) {
    if (p == "train") mask[0] = true;
    else if (p == "val") mask[1] = true;
    else if (p == "test") mask[2] = true;
    else fail("--augment-splits", "'" + p + "' in '" + splits + "' is not a split (train, val or test)");
  }
  return mask;
}

std::vector<std::pair<std::string, double>> AugmentArgs::weight_list() const {
  std::vector<std::pair<std::string, double>> out;
  std::set<std::string> seen;
  for (const auto& p : split_commas(noise_weights)) {
    const auto colon = p.rfind(':');
    if (colon == std::string::npos || colon == 0)
      fail("--noise-weights", "'" + p + "' in '" + noise_weights + "' is not SUBFOLDER:WEIGHT");
    const std::string name = p.substr(0, colon);
    const double w = parse_number(p.substr(colon + 1), "--noise-weights", noise_weights);
    if (!(w > 0.0)) fail("--noise-weights", "weight of '" + name + "' must be > 0, got " + default_text(w));
    if (!seen.insert(name).second) fail("--noise-weights", "subfolder '" + name + "' is given twice");
    out.emplace_back(name, w);
  }
  return out;
}

void AugmentArgs::validate() const {
  if (copies < 0 || copies > kMaxCopies)
    fail("--augment-copies", std::to_string(copies) + " is outside [0, " + std::to_string(kMaxCopies) + "]");
  split_mask();
  snr_range();
  const auto gain = gain_range();
  const auto speeds = speed_list();
  const auto weights = weight_list();
  check_probability(noise_prob, "--noise-prob");
  check_probability(rir_prob, "--rir-prob");
  check_folder(noise, "--noise");
  check_folder(rir, "--rir");
  if (!weights.empty() && noise.empty()) fail("--noise-weights", "needs --noise");
  bool speed_changes = false;
  for (double s : speeds) speed_changes = speed_changes || s != 1.0;
  const bool gain_changes = gain.first != 0.0 || gain.second != 0.0;
  if (copies > 0 && noise.empty() && rir.empty() && !speed_changes && !gain_changes)
    fail("--augment-copies", "copies would equal the clean file: give --noise, --rir, a --speed other than 1 or a "
                             "--gain-db range other than 0,0");
  if (copies == 0) {
    const char* given = !noise.empty() ? "--noise" : !rir.empty() ? "--rir" : speed_changes ? "--speed"
                        : gain_changes ? "--gain-db" : nullptr;
    if (given != nullptr)
      fail(given, "does nothing without --augment-copies K (K > 0 augmented copies per file)");
  }
}

void add_options(po::options_description& desc, AugmentArgs& args) {
  const auto path = [](std::filesystem::path& field) {
    return po::value<std::string>()->notifier([&field](const std::string& v) { field = v; });
  };
  desc.add_options()
    ("augment-copies", po::value<int>(&args.copies)->default_value(args.copies),
     "augmented copies written per file of the augmented splits, besides the clean copy (0..64; 0: no augmentation)")
    ("augment-splits", po::value<std::string>(&args.splits)->default_value(args.splits),
     "comma-separated splits whose files get augmented copies (train, val, test)")
    ("noise", path(args.noise),
     "folder of noise clips mixed into the copies, searched recursively (default: none, no noise)")
    ("noise-weights", po::value<std::string>(&args.noise_weights)->default_value(args.noise_weights),
     "weight per subfolder of --noise, e.g. noise:1,music:1,speech:1 (a subfolder by weight, then a clip of it; "
     "clips directly in --noise are the group '.'); empty: every clip equally likely")
    ("snr-db", po::value<std::string>(&args.snr_db)->default_value(args.snr_db),
     "MIN,MAX SNR of the noise in dB, drawn uniformly, measured on the active signal (each in [-60, 120])")
    ("noise-prob", po::value<double>(&args.noise_prob)->default_value(args.noise_prob, default_text(args.noise_prob)),
     "probability that a copy gets noise, in [0, 1]")
    ("rir", path(args.rir),
     "folder of room impulse responses a copy is convolved with, searched recursively (default: none)")
    ("rir-prob", po::value<double>(&args.rir_prob)->default_value(args.rir_prob, default_text(args.rir_prob)),
     "probability that a copy is reverberated, in [0, 1]")
    ("speed", po::value<std::string>(&args.speed)->default_value(args.speed),
     "comma-separated speed factors, one drawn uniformly per copy (e.g. 0.9,1.0,1.1; each in [0.5, 2]); tempo and "
     "pitch both scale, through the resampler")
    ("gain-db", po::value<std::string>(&args.gain_db)->default_value(args.gain_db),
     "MIN,MAX gain in dB, drawn uniformly, applied last (each in [-60, 30])");
}

}  // namespace melforge::augment
