#pragma once
/// SplitMix64 (Steele, Lea and Flood 2014): the seed hashes of the split assignment, the loader's per-epoch
/// shuffle and the per-rank generators.
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

}  // namespace melforge
