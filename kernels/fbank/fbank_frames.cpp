// Kaldi's per-frame preprocessing for the CPU engine. The loops are compiled for AVX2 and for the baseline (as
// mel/mel_cpu.cpp's); both use the same IEEE operations in the same order (the double sums in kLanes fixed partial
// sums, no FMA), so they give bitwise the same frames.
#include "fbank/fbank_frames.h"

#include <algorithm>
#include <cmath>

#include "fbank/fbank_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MELFORGE_NO_CLONES)
#define MELFORGE_FBANK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MELFORGE_FBANK_CLONES
#endif

namespace melforge::fbank {
namespace {

/// Partial sums of the frame sums: four AVX2 vectors of doubles, so that the additions' latency overlaps.
constexpr int kLanes = 16;

/// The kLanes partial sums added pairwise in a fixed order.
inline double add_lanes(const double* acc) {
  double pairs[kLanes / 2];
  for (int i = 0; i < kLanes / 2; ++i) pairs[i] = acc[i] + acc[i + kLanes / 2];
  return ((pairs[0] + pairs[4]) + (pairs[2] + pairs[6])) + ((pairs[1] + pairs[5]) + (pairs[3] + pairs[7]));
}

/// Sum over j < n of (x[j] - sub)^2, the difference and the square rounded to float as torchaudio's float32 tensors
/// hold them, accumulated in double in kLanes interleaved partial sums added in a fixed order.
MELFORGE_FBANK_CLONES double sum_squares(const float* __restrict x, int n, float sub) {
  double acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int i = 0; i < kLanes; ++i) {
      const float d = x[j + i] - sub;
      acc[i] += static_cast<double>(d * d);
    }
  }
  for (int i = 0; j < n; ++j, ++i) {
    const float d = x[j] - sub;
    acc[i] += static_cast<double>(d * d);
  }
  return add_lanes(acc);
}

/// Sum of x[0..n) in double, in kLanes interleaved partial sums added in a fixed order.
MELFORGE_FBANK_CLONES double sum(const float* __restrict x, int n) {
  double acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int i = 0; i < kLanes; ++i) acc[i] += static_cast<double>(x[j + i]);
  }
  for (int i = 0; j < n; ++j, ++i) acc[i] += static_cast<double>(x[j]);
  return add_lanes(acc);
}

/// dst[j] = ((x[j] - mean) - c * (x[j - 1] - mean)) * w[j] for j < n, with x[-1] = x[0]: DC removal, pre-emphasis and
/// window, each rounded to float as torchaudio's tensors are (mean 0: no DC removal; c 0: no pre-emphasis).
MELFORGE_FBANK_CLONES void emphasise(const float* __restrict x, float mean, float c, const float* __restrict w,
                                     float* __restrict dst, int n) {
  const float first = x[0] - mean;
  dst[0] = (first - c * first) * w[0];
  for (int j = 1; j < n; ++j) {
    const float a = x[j] - mean;
    const float b = x[j - 1] - mean;
    dst[j] = (a - c * b) * w[j];
  }
}

}  // namespace

FramePrep::FramePrep(const FbankArgs& args, int sample_rate) : args_(args) {
  args.validate(sample_rate);
  window_ = args.window_size(sample_rate);
  padded_ = args.padded_window_size(sample_rate);
  shift_ = args.window_shift(sample_rate);
  offset_ = args.snip_edges ? 0 : window_ / 2 - shift_ / 2;
  dither_ = static_cast<float>(args.dither);
  preemph_ = static_cast<float>(args.preemphasis_coefficient);
  log_energy_floor_ = args.energy_floor > 0.0 ? static_cast<float>(std::log(args.energy_floor)) : 0.0f;
  window_values_.resize(static_cast<std::size_t>(window_));
  for (int j = 0; j < window_; ++j) {
    window_values_[static_cast<std::size_t>(j)] =
        kaldi_window(static_cast<int>(args.window_type), j, window_, args.blackman_coeff);
  }
}

const float* FramePrep::source(const float* x, int64_t len, int64_t t, float* gather) const {
  const int64_t start = frame_start(t);
  if (start >= 0 && start + window_ <= len) return x + start;
  for (int j = 0; j < window_; ++j) {
    const int64_t p = start + j;
    int64_t i = -1;
    if (len > 0) i = args_.snip_edges ? (p >= 0 && p < len ? p : -1) : kaldi_mirror_index(p, len);
    gather[j] = i < 0 ? 0.0f : x[i];
  }
  return gather;
}

float FramePrep::prepare(const float* src, int64_t t, float* tmp, float* dst) const {
  const float* x = src;
  if (dither_ > 0.0f) {
    for (int j = 0; j < window_; ++j) tmp[j] = src[j] + dither_gauss(args_.dither_seed, t, j) * dither_;
    x = tmp;
  }
  const float mean =
      args_.remove_dc_offset ? static_cast<float>(sum(x, window_)) / static_cast<float>(window_) : 0.0f;
  double energy = 0.0;
  if (args_.use_energy && args_.raw_energy) energy = sum_squares(x, window_, mean);
  emphasise(x, mean, preemph_, window_values_.data(), dst, window_);
  std::fill(dst + window_, dst + padded_, 0.0f);
  if (!args_.use_energy) return 0.0f;
  if (!args_.raw_energy) energy = sum_squares(dst, window_, 0.0f);
  return kaldi_log_energy(static_cast<float>(energy), log_energy_floor_, args_.energy_floor > 0.0);
}

}  // namespace melforge::fbank
