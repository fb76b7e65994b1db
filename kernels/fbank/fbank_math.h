#pragma once
/// The per-element math of Kaldi's filterbank, shared by the CPU engine, the CUDA kernels and the tests. Every
/// function is `__host__ __device__` under nvcc and plain inline C++ otherwise (MELFORGE_HD, mel/mel_math.h).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "mel/mel_math.h"

namespace melforge::fbank {

/// Integer codes of KaldiWindow for the kernels: static_cast<int>(KaldiWindow).
enum KaldiWindowCode : int { kPovey = 0, kHamming = 1, kHanning = 2, kRectangular = 3, kBlackman = 4 };

/// Kaldi's mel scale: 1127 ln(1 + hz / 700).
MELFORGE_HD double kaldi_mel(double hz) { return 1127.0 * log(1.0 + hz / 700.0); }
/// Inverse of kaldi_mel.
MELFORGE_HD double kaldi_mel_to_hz(double mel) { return 700.0 * (exp(mel / 1127.0) - 1.0); }

/// Value at n (0 <= n < len, len >= 2) of Kaldi's symmetric window `code` (KaldiWindowCode), computed in double and
/// rounded once: povey (0.5 - 0.5 cos(2 pi n / (len - 1)))^0.85, hamming 0.54 - 0.46 cos(...), hanning the hann,
/// rectangular 1, blackman c - 0.5 cos(a n) + (0.5 - c) cos(2 a n) with a = 2 pi / (len - 1).
MELFORGE_HD float kaldi_window(int code, int n, int len, double blackman_coeff) {
  const double pi = 3.14159265358979323846;
  const double a = 2.0 * pi / (len - 1);
  const double hann = 0.5 - 0.5 * cos(a * n);
  switch (code) {
    case kPovey: return static_cast<float>(pow(hann, 0.85));
    case kHamming: return static_cast<float>(0.54 - 0.46 * cos(a * n));
    case kHanning: return static_cast<float>(hann);
    case kBlackman:
      return static_cast<float>(blackman_coeff - 0.5 * cos(a * n) + (0.5 - blackman_coeff) * cos(2.0 * a * n));
    default: return 1.0f;
  }
}

/// Index into a clip of `len` samples (len >= 1) of position j under Kaldi's mirroring (snip_edges false): j itself
/// inside [0, len), -j - 1 left of it, 2 len - 1 - j right of it (the edge sample repeated); -1 when j lies beyond
/// one mirror image (j < -len or j >= 2 len), where the sample is zero.
MELFORGE_HD int64_t kaldi_mirror_index(int64_t j, int64_t len) {
  if (j >= 0 && j < len) return j;
  if (j < 0 && j >= -len) return -j - 1;
  if (j >= len && j < 2 * len) return 2 * len - 1 - j;
  return -1;
}

/// Uniform in (0, 1] from a 64-bit hash: the top 24 bits, plus one, over 2^24.
MELFORGE_HD float unit_uniform(uint64_t h) { return (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f); }

/// SplitMix64's mix (common/splitmix.h), for the kernels.
MELFORGE_HD uint64_t fbank_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Standard normal draw for sample j of frame t of a clip under `seed` (Box-Muller of two hashed uniforms, in
/// float): the dither noise, the same on every device and for any batching.
MELFORGE_HD float dither_gauss(uint64_t seed, int64_t t, int j) {
  const uint64_t h = fbank_mix(fbank_mix(seed ^ 0x6a09e667f3bcc909ULL) + static_cast<uint64_t>(t) * 0x100000001ULL +
                               static_cast<uint64_t>(j));
  const float u1 = unit_uniform(h);
  const float u2 = unit_uniform(fbank_mix(h));
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

/// log(max(energy, FLT_EPSILON)), then floored at log(energy_floor) when energy_floor > 0 (torchaudio's
/// _get_log_energy).
MELFORGE_HD float kaldi_log_energy(float energy, float log_energy_floor, bool floored) {
  const float e = logf(energy > FLT_EPSILON ? energy : FLT_EPSILON);
  return floored && e < log_energy_floor ? log_energy_floor : e;
}

/// log(max(x, FLT_EPSILON)): Kaldi's log of a mel energy (use_log_fbank).
MELFORGE_HD float kaldi_log(float x) { return logf(x > FLT_EPSILON ? x : FLT_EPSILON); }

}  // namespace melforge::fbank
