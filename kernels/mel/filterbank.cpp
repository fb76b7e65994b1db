// The mel filterbank, computed step by step in the precision torchaudio 0.13 uses (torch 1.13 on x86-64 CPU), so that
// the weights match torchaudio.functional.melscale_fbanks to float32 rounding:
// - hz_to_mel of f_min and f_max in double (torchaudio's `_hz_to_mel` uses Python floats);
// - `torch.linspace` in float32, reproducing ATen's CPU kernel (see `torch_linspace`);
// - `_mel_to_hz`, the triangle slopes and the slaney normalisation as float32 tensor arithmetic.
// torch evaluates exp, and pow in chunks of 16 elements, with SLEEF's vector functions (within 1 ulp) where this file
// uses glibc's expf/powf, so a filter edge may sit one float32 ulp away from torch's. The weights then differ by at
// most ~1e-5 of the band's peak (measured over 1300 configurations) and are bitwise equal almost everywhere else.
#include "mel/filterbank.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>

#include "melforge/common/errors.h"
#include "fbank/fbank_math.h"
#include "mel/mel_math.h"

namespace melforge::mel {
namespace {

/// float32 `torch.linspace(start, end, steps)` as ATen 1.13's CPU kernel computes it: step = (end - start) /
/// (steps - 1) in float; element i is start + step*i below steps/2 and end - step*(steps-1-i) from there on, both fused
/// multiply-adds. The vectorised loop fills chunks of 16 from the first element of each half-chunk of 8 (computed as
/// above) by adding k*step (not fused); the last steps % 16 elements use the scalar formula.
std::vector<float> torch_linspace(float start, float end, int64_t steps) {
  std::vector<float> out(static_cast<std::size_t>(steps));
  if (steps <= 0) return out;
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  auto scalar = [&](int64_t i) {
    return i < halfway ? std::fma(step, static_cast<float>(i), start)
                       : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  };
  constexpr int64_t kVec = 8;
  const int64_t vectorised = steps / (2 * kVec) * (2 * kVec);
  for (int64_t i = 0; i < vectorised; i += kVec) {
    const float base = scalar(i);
    out[static_cast<std::size_t>(i)] = base;
    for (int64_t k = 1; k < kVec; ++k) {
      const float offset = static_cast<float>(k) * step;
      out[static_cast<std::size_t>(i + k)] = base + offset;
    }
  }
  for (int64_t i = vectorised; i < steps; ++i) out[static_cast<std::size_t>(i)] = scalar(i);
  return out;
}

/// torchaudio's `_mel_to_hz` on a float32 tensor of mels.
std::vector<float> mel_to_hz_f32(const std::vector<float>& mels, MelScale scale) {
  std::vector<float> hz(mels.size());
  if (scale == MelScale::htk) {
    for (std::size_t i = 0; i < mels.size(); ++i) {
      const float p = std::pow(10.0f, mels[i] / 2595.0f);
      hz[i] = 700.0f * (p - 1.0f);
    }
    return hz;
  }
  const double f_sp = 200.0 / 3;
  const double min_log_mel = 1000.0 / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  const auto f_sp_f = static_cast<float>(f_sp);
  const auto min_log_mel_f = static_cast<float>(min_log_mel);
  const auto logstep_f = static_cast<float>(logstep);
  for (std::size_t i = 0; i < mels.size(); ++i) {
    hz[i] = f_sp_f * mels[i];
    if (mels[i] >= min_log_mel_f) hz[i] = 1000.0f * std::exp(logstep_f * (mels[i] - min_log_mel_f));
  }
  return hz;
}

double hz_to_mel(double hz, MelScale scale) {
  return scale == MelScale::htk ? hz_to_mel_htk(hz) : hz_to_mel_slaney(hz);
}

/// Cache key: every field the filterbank depends on (for fbank, the sample rate and FbankArgs::to_string; the mel
/// fields are then those use_fbank derives).
using Key = std::tuple<Features, std::string, int, int, int, float, float, MelScale, MelNorm>;

/// Filterbank of the dense rows `rows` ([n_mels][n_freqs]), keeping each band's nonzero run.
Filterbank sparse_filterbank(const std::vector<float>& rows, int n_mels, int n_freqs) {
  Filterbank fb;
  fb.n_mels = n_mels;
  fb.n_freqs = n_freqs;
  fb.begin.resize(static_cast<std::size_t>(n_mels));
  fb.end.resize(static_cast<std::size_t>(n_mels));
  fb.offset.resize(static_cast<std::size_t>(n_mels) + 1);
  for (int m = 0; m < n_mels; ++m) {
    const float* row = rows.data() + static_cast<std::size_t>(m) * n_freqs;
    int first = -1, last = -1;
    for (int k = 0; k < n_freqs; ++k) {
      if (row[k] > 0.0f) {
        if (first < 0) first = k;
        last = k;
      }
    }
    fb.begin[m] = std::max(first, 0);
    fb.end[m] = last + 1;
    fb.offset[m] = static_cast<int32_t>(fb.weights.size());
    if (first >= 0) fb.weights.insert(fb.weights.end(), row + first, row + last + 1);
  }
  fb.offset[n_mels] = static_cast<int32_t>(fb.weights.size());
  return fb;
}

}  // namespace

std::vector<float> Filterbank::dense() const {
  std::vector<float> out(static_cast<std::size_t>(n_freqs) * static_cast<std::size_t>(n_mels), 0.0f);
  for (int m = 0; m < n_mels; ++m) {
    for (int k = begin[m]; k < end[m]; ++k) {
      out[static_cast<std::size_t>(k) * n_mels + m] = weights[static_cast<std::size_t>(offset[m] + k - begin[m])];
    }
  }
  return out;
}

Filterbank build_kaldi_filterbank(const MelArgs& args) {
  const fbank::FbankArgs& f = args.fbank;
  f.validate(args.sample_rate);
  const int padded = f.padded_window_size(args.sample_rate);
  const int num_fft_bins = padded / 2;
  const int n_freqs = num_fft_bins + 1;
  const int bins = f.num_mel_bins;
  const double sample_freq = args.sample_rate;
  const auto bin_width = static_cast<float>(sample_freq / padded);
  const auto mel_low = static_cast<float>(fbank::kaldi_mel(f.low_freq));
  const double mel_high = fbank::kaldi_mel(f.effective_high_freq(args.sample_rate));
  const auto delta = static_cast<float>((mel_high - fbank::kaldi_mel(f.low_freq)) / (bins + 1));
  std::vector<float> mel(static_cast<std::size_t>(num_fft_bins));
  for (int k = 0; k < num_fft_bins; ++k) {
    const float hz = bin_width * static_cast<float>(k);
    mel[static_cast<std::size_t>(k)] = 1127.0f * std::log(1.0f + hz / 700.0f);
  }
  std::vector<float> rows(static_cast<std::size_t>(bins) * n_freqs, 0.0f);
  for (int b = 0; b < bins; ++b) {
    const float left = mel_low + static_cast<float>(b) * delta;
    const float center = mel_low + (static_cast<float>(b) + 1.0f) * delta;
    const float right = mel_low + (static_cast<float>(b) + 2.0f) * delta;
    for (int k = 0; k < num_fft_bins; ++k) {
      const float m = mel[static_cast<std::size_t>(k)];
      const float up = (m - left) / (center - left);
      const float down = (right - m) / (right - center);
      rows[static_cast<std::size_t>(b) * n_freqs + k] = std::max(0.0f, std::min(up, down));
    }
  }
  return sparse_filterbank(rows, bins, n_freqs);
}

Filterbank build_filterbank(const MelArgs& args) {
  if (args.is_fbank()) return build_kaldi_filterbank(args);
  if (args.n_fft < 2 || args.n_mels < 1 || args.sample_rate <= 0) {
    throw InvalidArgument("filterbank: needs n_fft >= 2, n_mels >= 1 and sample_rate > 0");
  }
  const int n_freqs = args.n_freqs();
  const int n_mels = args.n_mels;
  const std::vector<float> all_freqs =
      torch_linspace(0.0f, static_cast<float>(args.sample_rate / 2), static_cast<int64_t>(n_freqs));
  const auto m_min = static_cast<float>(hz_to_mel(static_cast<double>(args.f_min), args.mel_scale));
  const auto m_max = static_cast<float>(hz_to_mel(static_cast<double>(args.fmax()), args.mel_scale));
  const std::vector<float> f_pts = mel_to_hz_f32(torch_linspace(m_min, m_max, n_mels + 2), args.mel_scale);

  std::vector<float> rows(static_cast<std::size_t>(n_mels) * static_cast<std::size_t>(n_freqs));
  for (int m = 0; m < n_mels; ++m) {
    float* row = rows.data() + static_cast<std::size_t>(m) * n_freqs;
    const float f_lo = f_pts[m], f_mid = f_pts[m + 1], f_hi = f_pts[m + 2];
    const float diff_lo = f_mid - f_lo;
    const float diff_hi = f_hi - f_mid;
    const float enorm = args.mel_norm == MelNorm::slaney ? 2.0f / (f_hi - f_lo) : 1.0f;
    for (int k = 0; k < n_freqs; ++k) {
      const float down = -(f_lo - all_freqs[k]) / diff_lo;
      const float up = (f_hi - all_freqs[k]) / diff_hi;
      float w = std::fmax(0.0f, std::fmin(down, up));
      if (std::isnan(down) || std::isnan(up)) w = NAN;
      if (args.mel_norm == MelNorm::slaney) w *= enorm;
      if (!std::isfinite(w)) {
        throw InvalidArgument("filterbank: mel band " + std::to_string(m) + " has edges " + std::to_string(f_lo) +
                              ", " + std::to_string(f_mid) + ", " + std::to_string(f_hi) +
                              " Hz that coincide: n_mels " + std::to_string(n_mels) + " is too large");
      }
      row[k] = w;
    }
  }
  return sparse_filterbank(rows, n_mels, n_freqs);
}

std::vector<int> Filterbank::empty_bands() const {
  std::vector<int> bands;
  for (int m = 0; m < n_mels; ++m)
    if (end[m] <= begin[m]) bands.push_back(m);
  return bands;
}

std::string empty_bands_warning(const MelArgs& args) {
  const std::vector<int> bands = cached_filterbank(args)->empty_bands();
  if (bands.empty()) return {};
  std::string list;
  for (std::size_t i = 0; i < bands.size(); ++i) list += (i ? ", " : "") + std::to_string(bands[i]);
  std::ostringstream bin_hz;
  bin_hz << static_cast<double>(args.sample_rate) / args.n_fft;
  return "At least one mel filterbank has all zero values (mel band" + std::string(bands.size() > 1 ? "s " : " ") +
         list + " of " + std::to_string(args.n_mels) + (bands.size() > 1 ? " hold" : " holds") +
         " no FFT bin, so its energy is 0). The value for " +
         "n_mels (" + std::to_string(args.n_mels) + ") may be set too high. Or, the value for n_fft (" +
         std::to_string(args.n_fft) + ": " + std::to_string(args.n_freqs()) + " frequency bins, " + bin_hz.str() +
         " Hz apart) may be set too low.";
}

std::shared_ptr<const Filterbank> cached_filterbank(const MelArgs& args) {
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const Filterbank>> cache;
  const Key key{args.features, args.is_fbank() ? args.fbank.to_string() : std::string(), args.sample_rate, args.n_fft,
                args.n_mels,    args.f_min,  args.fmax(), args.mel_scale, args.mel_norm};
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto fb = std::make_shared<const Filterbank>(build_filterbank(args));
  cache.emplace(key, fb);
  return fb;
}

}  // namespace melforge::mel
