#pragma once
/// The per-element math of the mel pipeline, shared by the CPU engine, the CUDA kernels and the tests.
/// Every function here is `__host__ __device__` under nvcc and plain inline C++ otherwise.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MELFORGE_HD __host__ __device__ __forceinline__
#else
#define MELFORGE_HD inline
#endif

namespace melforge::mel {

/// Hz to mel, HTK formula: 2595*log10(1 + hz/700). Double precision, as torchaudio builds its filterbank in float32
/// from these; see filterbank.cpp for where precision is chosen.
MELFORGE_HD double hz_to_mel_htk(double hz) { return 2595.0 * log10(1.0 + hz / 700.0); }
/// Mel to Hz, HTK formula.
MELFORGE_HD double mel_to_hz_htk(double mel) { return 700.0 * (pow(10.0, mel / 2595.0) - 1.0); }

/// Hz to mel, Slaney formula (linear below 1 kHz, logarithmic above), as torchaudio's `_hz_to_mel(..., "slaney")`.
MELFORGE_HD double hz_to_mel_slaney(double hz) {
  const double f_sp = 200.0 / 3.0;
  const double min_log_hz = 1000.0;
  const double min_log_mel = min_log_hz / f_sp;
  const double logstep = log(6.4) / 27.0;
  return hz >= min_log_hz ? min_log_mel + log(hz / min_log_hz) / logstep : hz / f_sp;
}
/// Mel to Hz, Slaney formula.
MELFORGE_HD double mel_to_hz_slaney(double mel) {
  const double f_sp = 200.0 / 3.0;
  const double min_log_hz = 1000.0;
  const double min_log_mel = min_log_hz / f_sp;
  const double logstep = log(6.4) / 27.0;
  return mel >= min_log_mel ? min_log_hz * exp(logstep * (mel - min_log_mel)) : f_sp * mel;
}

/// Periodic Hann window value at n of a window of length `len` (torch.hann_window(len, periodic=True); a window of
/// length 1 is [1], as torch returns).
MELFORGE_HD float hann(int n, int len) {
  if (len == 1) return 1.0f;
  const double pi = 3.14159265358979323846;
  return static_cast<float>(0.5 - 0.5 * cos(2.0 * pi * n / len));
}
/// Periodic Hamming window value (torch.hamming_window(len, periodic=True)).
MELFORGE_HD float hamming(int n, int len) {
  if (len == 1) return 1.0f;
  const double pi = 3.14159265358979323846;
  return static_cast<float>(0.54 - 0.46 * cos(2.0 * pi * n / len));
}

/// Index into a signal of length `len` for padded position `i` (may be negative or >= len) under reflect padding
/// (numpy/torch "reflect": the edge sample is not repeated). Requires len >= 2 and -len < i < 2*len - 1.
MELFORGE_HD int64_t reflect_index(int64_t i, int64_t len) {
  if (i < 0) return -i;
  if (i >= len) return 2 * (len - 1) - i;
  return i;
}

/// Position `j` (may be negative or >= len) of a clip of `len` samples of which only samples [origin, origin + n) are
/// at hand, sample origin + i at x[i]: the sample itself inside [0, len), its reflection (`reflect` true; as
/// reflect_index requires) or zero outside. The caller makes sure the sample read lies in [origin, origin + n).
MELFORGE_HD float clip_sample(const float* x, int64_t origin, int64_t len, int64_t j, bool reflect) {
  if (j >= 0 && j < len) return x[j - origin];
  if (!reflect) return 0.0f;
  return x[reflect_index(j, len) - origin];
}

/// Sample `i` of a segment `x` of length `len` after padding by `pad` on the left: position `i - pad` of x,
/// reflected (`reflect` true) or zero outside [0, len).
MELFORGE_HD float padded_sample(const float* x, int64_t len, int64_t i, int64_t pad, bool reflect) {
  return clip_sample(x, 0, len, i - pad, reflect);
}

/// |X|^power for a complex bin (re, im). power 2 avoids the square root; power 1 is the magnitude.
MELFORGE_HD float spectral_power(float re, float im, float power) {
  const float p2 = re * re + im * im;
  if (power == 2.0f) return p2;
  if (power == 1.0f) return sqrtf(p2);
  return powf(p2, 0.5f * power);
}

/// Log compression. mode 0 = db: (20/power)*log10(max(x, amin)); 1 = ln: log(x + eps); 2 = none: x.
/// The integer codes equal `static_cast<int>(LogMode)`.
MELFORGE_HD float log_compress(float x, int mode, float power, float amin, float eps) {
  if (mode == 0) return (20.0f / power) * log10f(x > amin ? x : amin);
  if (mode == 1) return logf(x + eps);
  return x;
}

/// Number of frames torch.stft (and so torchaudio.transforms.MelSpectrogram) gives for a signal of `samples` samples
/// padded by `pad` on each side (n_fft/2 when centred, else 0), whatever the pad mode: 1 + (samples + 2*pad - n_fft) /
/// hop, or 0 when the padded signal is shorter than n_fft. hop >= 1.
MELFORGE_HD int64_t stft_frames(int64_t samples, int n_fft, int hop, int pad) {
  const int64_t padded = samples + 2 * static_cast<int64_t>(pad);
  if (padded < n_fft) return 0;
  return 1 + (padded - n_fft) / hop;
}

/// stft_frames as an int, for a segment (a segment's frame count fits in an int).
MELFORGE_HD int frame_count(int64_t samples, int n_fft, int hop, int pad) {
  return static_cast<int>(stft_frames(samples, n_fft, hop, pad));
}

/// Frames a whole clip of `samples` samples gets (MelEngine::compute_clips): stft_frames, or 1 when that is 0 (a clip
/// too short for one frame is zero-padded on the right to one frame and flagged kClipPaddedToFrame).
MELFORGE_HD int64_t clip_frames(int64_t samples, int n_fft, int hop, int pad) {
  const int64_t frames = stft_frames(samples, n_fft, hop, pad);
  return frames > 0 ? frames : 1;
}

/// Whether a clip of `samples` samples is reflect-padded: reflect padding was asked (`reflect`: center and pad_mode
/// reflect) and the clip is longer than `pad` (torch.stft refuses reflect padding otherwise; such a clip is padded
/// with zeros instead and flagged kClipZeroEdges).
MELFORGE_HD bool clip_reflects(int64_t samples, int pad, bool reflect) { return reflect && samples > pad; }

}  // namespace melforge::mel
