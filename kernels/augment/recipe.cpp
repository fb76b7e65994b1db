// The recipe of an augmented copy (augment.h): draws from one splitmix64 stream per (seed, path, copy), in a fixed
// order, every draw made whether it is needed or not.
#include <cmath>

#include "augment/augment.h"
#include "melforge/common/errors.h"
#include "melforge/common/splitmix.h"

namespace melforge::augment {
namespace {

/// FNV-1a, 64-bit, of the bytes of `text`.
uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

__extension__ typedef unsigned __int128 Uint128;

/// `bits` scaled to an integer uniform in [0, n) (multiply-shift: the high 64 bits of bits x n); 0 when n <= 0.
int64_t scale_bits(uint64_t bits, int64_t n) {
  if (n <= 0) return 0;
  return static_cast<int64_t>((static_cast<Uint128>(bits) * static_cast<uint64_t>(n)) >> 64);
}

/// A splitmix64 stream: state advanced by the golden-ratio increment, each output mixed.
class Stream {
 public:
  /// The stream of copy `copy` of the file whose path hashes to `path_hash`, under `seed`.
  Stream(uint64_t path_hash, uint64_t seed, int copy)
      : state_(splitmix64(splitmix64(path_hash ^ splitmix64_mix(seed)) ^ static_cast<uint64_t>(copy))) {}
  /// The next 64 random bits.
  uint64_t bits() {
    state_ += kSplitMixGamma;
    return splitmix64_mix(state_);
  }
  /// Uniform in [0, 1), 53 bits.
  double uniform() { return static_cast<double>(bits() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n); 0 when n <= 0 (the draw is made all the same).
  int64_t below(int64_t n) { return scale_bits(bits(), n); }

 private:
  uint64_t state_;
};

/// A value uniform in [range.first, range.second] from u in [0, 1); exactly `first` for an empty range.
double in_range(std::pair<double, double> range, double u) { return range.first + u * (range.second - range.first); }

/// The noise clip picked by group weight: the group whose cumulative weight passes `u` x the total, then clip
/// `pick` among the group's clips in bank order. Throws InvalidArgument when a weighted group has no clip.
int pick_weighted(const std::vector<std::pair<std::string, double>>& weights, const Bank& noise, double u,
                  uint64_t pick) {
  std::vector<int64_t> counts(weights.size(), 0);
  for (const auto& c : noise.clips) {
    for (size_t g = 0; g < weights.size(); ++g)
      if (c.group == weights[g].first) ++counts[g];
  }
  double total = 0.0;
  for (size_t g = 0; g < weights.size(); ++g) {
    if (counts[g] == 0)
      throw InvalidArgument("--noise-weights: subfolder '" + weights[g].first + "' holds no clip of --noise");
    total += weights[g].second;
  }
  const double target = u * total;
  size_t group = weights.size() - 1;
  double cumulative = 0.0;
  for (size_t g = 0; g < weights.size(); ++g) {
    cumulative += weights[g].second;
    if (target < cumulative) {
      group = g;
      break;
    }
  }
  const int64_t k = scale_bits(pick, counts[group]);
  int64_t seen = 0;
  for (size_t i = 0; i < noise.clips.size(); ++i) {
    if (noise.clips[i].group != weights[group].first) continue;
    if (seen++ == k) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

Recipe draw_recipe(const AugmentArgs& args, const Bank& noise, const Bank& rir, uint64_t seed, std::string_view path,
                   int copy) {
  Recipe r;
  r.copy = copy;
  if (copy <= 0) return r;
  Stream s(fnv1a(path), seed, copy);
  const auto speeds = args.speed_list();
  r.speed = speeds[static_cast<size_t>(s.below(static_cast<int64_t>(speeds.size())))];

  const double rir_u = s.uniform();
  const int64_t rir_clip = s.below(static_cast<int64_t>(rir.clips.size()));
  if (!rir.empty() && rir_u < args.rir_prob) r.rir = static_cast<int>(rir_clip);

  const double noise_u = s.uniform();
  const double group_u = s.uniform();
  const uint64_t clip_bits = s.bits();
  const auto weights = args.weight_list();
  int clip = -1;
  if (!noise.empty()) {
    clip = weights.empty()
               ? static_cast<int>(scale_bits(clip_bits, static_cast<int64_t>(noise.clips.size())))
               : pick_weighted(weights, noise, group_u, clip_bits);
  }
  const int64_t offset = s.below(clip >= 0 ? static_cast<int64_t>(noise.clips[static_cast<size_t>(clip)].samples.size())
                                           : 0);
  const double snr = in_range(args.snr_range(), s.uniform());
  if (clip >= 0 && noise_u < args.noise_prob) {
    r.noise = clip;
    r.noise_offset = offset;
    r.snr_db = snr;
  }

  r.gain_db = in_range(args.gain_range(), s.uniform());
  return r;
}

int speed_decode_rate(int sample_rate, double speed) {
  if (!(speed > 0.0) || !std::isfinite(speed) || sample_rate <= 0)
    throw InvalidArgument("speed_decode_rate: speed " + std::to_string(speed) + " and sample rate " +
                          std::to_string(sample_rate) + " must be positive");
  return static_cast<int>(std::lround(sample_rate / speed));
}

}  // namespace melforge::augment
