#pragma once
/// Kaldi's per-frame preprocessing on the CPU, as torchaudio.compliance.kaldi's _get_window computes it: framing
/// (snip_edges, mirrored edges), dither, DC removal, energy, pre-emphasis, window and zero padding. The CPU engine
/// (mel/mel_cpu.cpp) runs it into its FFT batch; the FFT, power, filterbank and log stages are the mel engine's.
#include <cstdint>
#include <vector>

#include "fbank/fbank_args.h"

namespace melforge::fbank {

/// The constants of one FbankArgs at one sample rate, and the per-frame loops. Immutable: one instance serves every
/// thread (each passes its own buffers).
class FramePrep {
 public:
  /// Throws InvalidArgument when `args` is invalid at `sample_rate` (FbankArgs::validate).
  FramePrep(const FbankArgs& args, int sample_rate);

  /// Window length, samples.
  int window() const { return window_; }
  /// FFT size (padded window), samples.
  int padded() const { return padded_; }
  /// Frame shift, samples.
  int shift() const { return shift_; }
  /// First sample of frame t in its clip (negative, or reaching past the clip, with snip_edges false).
  int64_t frame_start(int64_t t) const { return t * shift_ - offset_; }

  /// The window() samples of frame t of the clip `x` of `len` samples: a pointer into `x` when the frame lies inside
  /// [0, len), else `gather` (window() floats) filled with Kaldi's mirror image of the clip (kaldi_mirror_index) and
  /// zeros beyond it or beyond the end of a clip shorter than a frame.
  const float* source(const float* x, int64_t len, int64_t t, float* gather) const;

  /// Preprocesses the window() samples `src` of frame t (its index in its clip, which seeds the dither) into
  /// dst[padded()]: + dither * dither_gauss(dither_seed, t, j), minus the frame mean (remove_dc_offset), raw energy,
  /// x[j] - c * x[j - 1] (x[-1] = x[0]), times the window, zeros up to padded(), energy after all that (raw_energy
  /// false). Each step is torchaudio's float32 operation; the sums (mean, energy) are accumulated in double. `tmp`:
  /// window() floats of scratch. Returns the log energy (kaldi_log_energy with energy_floor), 0 without use_energy.
  float prepare(const float* src, int64_t t, float* tmp, float* dst) const;

  /// The window, window() values (fbank_math.h's kaldi_window).
  const std::vector<float>& window_values() const { return window_values_; }

 private:
  FbankArgs args_;
  int window_ = 0;
  int padded_ = 0;
  int shift_ = 0;
  int64_t offset_ = 0;
  float dither_ = 0.0f;
  float preemph_ = 0.0f;
  float log_energy_floor_ = 0.0f;
  std::vector<float> window_values_;
};

}  // namespace melforge::fbank
