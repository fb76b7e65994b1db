#pragma once
/// Naive log-mel reference for the tests: the formulas written out directly in double precision, with a direct
/// O(N^2) DFT and a dense filterbank, sharing no code with the engines. Also the tolerance used to compare a float32
/// spectrogram with a reference one, the test signals, and the decoding of an engine's output bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mel/mel_args.h"

namespace melforge::test {

/// Hz to mel in double (HTK or Slaney), written out independently of mel_math.h.
inline double ref_hz_to_mel(double hz, mel::MelScale scale) {
  if (scale == mel::MelScale::htk) return 2595.0 * std::log10(1.0 + hz / 700.0);
  const double f_sp = 200.0 / 3.0;
  if (hz < 1000.0) return hz / f_sp;
  return 1000.0 / f_sp + std::log(hz / 1000.0) / (std::log(6.4) / 27.0);
}

/// Mel to Hz in double.
inline double ref_mel_to_hz(double mel, mel::MelScale scale) {
  if (scale == mel::MelScale::htk) return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
  const double f_sp = 200.0 / 3.0;
  const double min_log_mel = 1000.0 / f_sp;
  if (mel < min_log_mel) return mel * f_sp;
  return 1000.0 * std::exp(std::log(6.4) / 27.0 * (mel - min_log_mel));
}

/// Dense filterbank [n_freqs][n_mels] (row-major, as torchaudio's melscale_fbanks) in double: bins at
/// k*(sample_rate/2)/(n_freqs-1) Hz (integer sample_rate/2, as torchaudio), n_mels+2 edges equally spaced in mel
/// between f_min and fmax(), triangles, optional slaney area normalisation 2/(f[m+2]-f[m]).
inline std::vector<double> reference_filterbank(const mel::MelArgs& a) {
  const int n_freqs = a.n_freqs();
  const int n_mels = a.n_mels;
  const double m_lo = ref_hz_to_mel(a.f_min, a.mel_scale);
  const double m_hi = ref_hz_to_mel(a.fmax(), a.mel_scale);
  std::vector<double> f(static_cast<std::size_t>(n_mels) + 2);
  for (int i = 0; i < n_mels + 2; ++i) f[i] = ref_mel_to_hz(m_lo + (m_hi - m_lo) * i / (n_mels + 1), a.mel_scale);
  std::vector<double> fb(static_cast<std::size_t>(n_freqs) * n_mels, 0.0);
  for (int k = 0; k < n_freqs; ++k) {
    const double hz = static_cast<double>(a.sample_rate / 2) * k / (n_freqs - 1);
    for (int m = 0; m < n_mels; ++m) {
      const double rising = (hz - f[m]) / (f[m + 1] - f[m]);
      const double falling = (f[m + 2] - hz) / (f[m + 2] - f[m + 1]);
      double w = std::max(0.0, std::min(rising, falling));
      if (a.mel_norm == mel::MelNorm::slaney) w *= 2.0 / (f[m + 2] - f[m]);
      fb[static_cast<std::size_t>(k) * n_mels + m] = w;
    }
  }
  return fb;
}

/// Log-mel spectrogram [n_mels][n_frames] of the `len` samples at `x`, in double: explicit padding (numpy "reflect"
/// or zeros) by n_fft/2 when centred, a periodic window of win() samples centred in n_fft, a direct DFT, |X|^power,
/// the dense filterbank `fb` ([n_freqs][n_mels]), then the log of `a.log`.
inline std::vector<double> reference_log_mel(const mel::MelArgs& a, const float* x, int64_t len,
                                             const std::vector<double>& fb) {
  const int n_fft = a.n_fft, n_freqs = a.n_freqs(), n_mels = a.n_mels, hop = a.hop(), win = a.win();
  const int64_t pad = a.center ? n_fft / 2 : 0;
  std::vector<double> padded(static_cast<std::size_t>(len + 2 * pad), 0.0);
  for (int64_t i = 0; i < len; ++i) padded[static_cast<std::size_t>(pad + i)] = x[i];
  if (a.center && a.pad_mode == mel::PadMode::reflect) {
    for (int64_t i = 1; i <= pad; ++i) {
      padded[static_cast<std::size_t>(pad - i)] = x[i];
      padded[static_cast<std::size_t>(pad + len - 1 + i)] = x[len - 1 - i];
    }
  }
  const double pi = 3.14159265358979323846;
  std::vector<double> window(static_cast<std::size_t>(n_fft), 0.0);
  for (int j = 0; j < win; ++j) {
    const double c = std::cos(2.0 * pi * j / win);
    window[static_cast<std::size_t>((n_fft - win) / 2 + j)] =
        win == 1 ? 1.0 : (a.window == mel::Window::hann ? 0.5 - 0.5 * c : 0.54 - 0.46 * c);
  }
  std::vector<double> cos_table(static_cast<std::size_t>(n_fft)), sin_table(static_cast<std::size_t>(n_fft));
  for (int i = 0; i < n_fft; ++i) {
    cos_table[i] = std::cos(2.0 * pi * i / n_fft);
    sin_table[i] = std::sin(2.0 * pi * i / n_fft);
  }
  const int n_frames = padded.size() < static_cast<std::size_t>(n_fft)
                           ? 0
                           : static_cast<int>(1 + (static_cast<int64_t>(padded.size()) - n_fft) / hop);
  std::vector<double> out(static_cast<std::size_t>(n_mels) * n_frames);
  std::vector<double> frame(static_cast<std::size_t>(n_fft)), spec(static_cast<std::size_t>(n_freqs));
  for (int t = 0; t < n_frames; ++t) {
    for (int j = 0; j < n_fft; ++j) frame[j] = padded[static_cast<std::size_t>(t) * hop + j] * window[j];
    for (int k = 0; k < n_freqs; ++k) {
      double re = 0.0, im = 0.0;
      for (int j = 0; j < n_fft; ++j) {
        const auto idx = static_cast<std::size_t>((static_cast<int64_t>(k) * j) % n_fft);
        re += frame[j] * cos_table[idx];
        im -= frame[j] * sin_table[idx];
      }
      spec[k] = std::pow(re * re + im * im, 0.5 * a.power);
    }
    for (int m = 0; m < n_mels; ++m) {
      double e = 0.0;
      for (int k = 0; k < n_freqs; ++k) e += fb[static_cast<std::size_t>(k) * n_mels + m] * spec[k];
      double v = e;
      if (a.log == mel::LogMode::db) v = 20.0 / a.power * std::log10(std::max(e, static_cast<double>(a.amin)));
      if (a.log == mel::LogMode::ln) v = std::log(e + a.log_eps);
      out[static_cast<std::size_t>(m) * n_frames + t] = v;
    }
  }
  return out;
}

/// The linear mel energy (|X|^power summed over a band) that a log-mel value `v` stands for: the inverse of the log.
inline double unlog(double v, const mel::MelArgs& a) {
  if (a.log == mel::LogMode::db) return std::pow(10.0, v * a.power / 20.0);
  if (a.log == mel::LogMode::ln) return std::exp(v) - a.log_eps;
  return v;
}

/// Agreement of one spectrogram with its reference, in the linear (energy) domain.
///
/// Element (m, t) passes when |A - B| <= rel * |B| + floor_rel * P_t + eps_term, where A and B are unlog() of the
/// tested and reference values and P_t is the largest reference energy of frame t (over its n_mels bands). Why these
/// terms:
/// - rel (1e-4): the agreement we require of every band that is not buried in rounding noise.
/// - floor_rel * P_t (1e-6, a 60 dB dynamic range below each frame's loudest band): a float32 FFT (FFTW, pocketfft,
///   cuFFT) has an absolute error of about eps*log2(n_fft)*|X|_max ~ 1e-7 of the frame's largest magnitude in every
///   bin, so energies more than ~60 dB below their own frame's peak carry no relative precision in any float32
///   implementation, the reference included. The floor is per frame, not per spectrogram: a quiet frame next to a
///   loud one keeps its own precision, and a spectrogram-wide floor let an all-silent output pass 38% of the values
///   of the fixture htk_1024_128_quiet (docs/RELIABILITY.md, "Test tolerances", has the table per fixture).
/// - eps_term: for `ln`, 1e-5*log_eps, the float32 resolution of log(x + log_eps) near x = 0 (|log(log_eps)| ~ 14,
///   one ulp ~ 1e-6, times e^v); 0 otherwise (`db` clamps at amin, whose log both sides compute identically).
struct Tolerance {
  /// Relative term.
  double rel = 1e-4;
  /// Floor as a fraction of the frame's peak energy.
  double floor_rel = 1e-6;
};

/// Outcome of compare_log_mel.
struct Comparison {
  /// Elements compared.
  int64_t count = 0;
  /// Elements outside the tolerance.
  int64_t failures = 0;
  /// Largest |A - B| / allowed over all elements (<= 1 when everything passes).
  double worst_ratio = 0.0;
  /// Index of the worst element.
  int64_t worst_index = -1;
};

/// Compares one tested spectrogram `actual` with `expected`, both [n_mels][n_frames] row-major, under `tol` (see
/// Tolerance).
template <class A, class B>
Comparison compare_log_mel(const A* actual, const B* expected, int n_mels, int n_frames, const mel::MelArgs& a,
                           Tolerance tol = {}) {
  const auto at = [n_frames](int m, int t) { return static_cast<int64_t>(m) * n_frames + t; };
  const double eps_term = a.log == mel::LogMode::ln ? 1e-5 * a.log_eps : 0.0;
  Comparison c;
  c.count = static_cast<int64_t>(n_mels) * n_frames;
  for (int t = 0; t < n_frames; ++t) {
    double frame_peak = 0.0;
    for (int m = 0; m < n_mels; ++m) {
      frame_peak = std::max(frame_peak, std::abs(unlog(static_cast<double>(expected[at(m, t)]), a)));
    }
    for (int m = 0; m < n_mels; ++m) {
      const int64_t i = at(m, t);
      const double x = unlog(static_cast<double>(actual[i]), a);
      const double y = unlog(static_cast<double>(expected[i]), a);
      const double allowed = tol.rel * std::abs(y) + tol.floor_rel * frame_peak + eps_term;
      const double ratio = std::abs(x - y) / allowed;
      if (!(ratio <= 1.0)) ++c.failures;
      if (!(ratio <= c.worst_ratio)) {
        c.worst_ratio = ratio;
        c.worst_index = i;
      }
    }
  }
  return c;
}

/// A test signal: two sines plus seeded uniform noise, a1*sin(w1*t) + a2*sin(w2*t + phase2) + U(-noise, noise).
struct ToneMix {
  /// Amplitude and angular frequency (radians per sample) of the first sine.
  double a1 = 0.5, w1 = 0.013;
  /// Amplitude, angular frequency and phase of the second sine.
  double a2 = 0.25, w2 = 0.71, phase2 = 0.3;
  /// Half-width of the uniform noise.
  float noise = 0.2f;
};

/// `n` samples of `mix`, the noise seeded with `seed`.
inline std::vector<float> tone_signal(int64_t n, unsigned seed, const ToneMix& mix) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-mix.noise, mix.noise);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i);
    x[static_cast<size_t>(i)] =
        static_cast<float>(mix.a1 * std::sin(mix.w1 * t) + mix.a2 * std::sin(mix.w2 * t + mix.phase2)) + noise(rng);
  }
  return x;
}

/// `count` random segment starts in [0, signal_len - segment_samples], seeded.
inline std::vector<int64_t> make_offsets(int64_t count, int64_t signal_len, int64_t segment_samples, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> start(0, signal_len - segment_samples);
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  for (auto& o : offsets) o = start(rng);
  return offsets;
}

/// IEEE half bits to float, written independently of cuda_fp16.h and kernels/mel/half.h.
inline float half_to_float(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float v = 0.0f;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa != 0 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

/// Output element i of a buffer of float32 or IEEE half bits (elem_bytes 4 or 2) as float.
inline float element(const std::vector<unsigned char>& out, int64_t i, int elem_bytes) {
  if (elem_bytes == 2) {
    uint16_t h = 0;
    std::memcpy(&h, out.data() + i * 2, 2);
    return half_to_float(h);
  }
  float f = 0.0f;
  std::memcpy(&f, out.data() + i * 4, 4);
  return f;
}

}  // namespace melforge::test
