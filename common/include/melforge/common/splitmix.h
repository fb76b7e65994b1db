#pragma once
/// SplitMix64 (Steele, Lea and Flood 2014): the seed hashes of the split assignment, the loader's per-epoch
/// shuffle, the per-rank generators and the verification trial draw.
#include <cstdint>

namespace melforge {

/// SplitMix64's golden-ratio increment, 2^64 / phi.
inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;

/// SplitMix64's output function (the Stafford variant 13 mix) of a 64-bit state: a bijection that spreads every input
/// bit over the result.
constexpr uint64_t splitmix64_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// One SplitMix64 step from state `x`: the mix of x + kSplitMixGamma.
constexpr uint64_t splitmix64(uint64_t x) { return splitmix64_mix(x + kSplitMixGamma); }

/// A SplitMix64 stream: uniform 64-bit draws and unbiased draws in [0, n).
class SplitMixRng {
 public:
  /// A stream whose first draw is splitmix64(seed).
  explicit SplitMixRng(uint64_t seed) : state_(seed) {}

  /// The next uniform 64-bit value.
  uint64_t next() {
    state_ += kSplitMixGamma;
    return splitmix64_mix(state_);
  }

  /// A uniform value in [0, n), n > 0: draws below 2^64 mod n are rejected, so that no value is favoured.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace melforge
