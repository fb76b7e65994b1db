#pragma once
/// The mel filterbank, built as torchaudio.functional.melscale_fbanks builds it, and stored sparsely.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mel_args.h"

namespace melforge::mel {

/// Sparse mel filterbank: band m covers FFT bins [begin[m], end[m]) with weights
/// weights[offset[m] + (k - begin[m])]. A band that contains no FFT bin (an all-zero row of torchaudio's matrix, which
/// torchaudio only warns about, e.g. for its defaults n_fft 400 and n_mels 128) has begin == end and no weights: its
/// energy is 0.
struct Filterbank {
  /// Number of mel bands.
  int n_mels = 0;
  /// Number of one-sided FFT bins (n_fft/2+1).
  int n_freqs = 0;
  /// [n_mels] first FFT bin of each band.
  std::vector<int32_t> begin;
  /// [n_mels] one past the last FFT bin of each band.
  std::vector<int32_t> end;
  /// [n_mels + 1] start of each band's weights in `weights`; offset[n_mels] == weights.size().
  std::vector<int32_t> offset;
  /// Concatenated nonzero weights of all bands.
  std::vector<float> weights;

  /// Dense [n_freqs][n_mels] matrix, laid out as torchaudio's melscale_fbanks returns it (row-major).
  std::vector<float> dense() const;
  /// Bands with no FFT bin (end == begin), in increasing order; empty when every band has a bin.
  std::vector<int> empty_bands() const;
  /// Total number of stored weights (the mel stage does this many multiply-adds per frame).
  int64_t nnz() const { return static_cast<int64_t>(weights.size()); }
};

/// Builds the filterbank for `args`: for features mel (uses sample_rate, n_fft, n_mels, f_min, fmax(), mel_scale,
/// mel_norm) as torchaudio.functional.melscale_fbanks; for features fbank, build_kaldi_filterbank.
/// A band without an FFT bin is kept empty (Filterbank::empty_bands; empty_bands_warning says so). Throws
/// InvalidArgument naming the band when a band's edges coincide (its weights would be NaN).
Filterbank build_filterbank(const MelArgs& args);

/// Kaldi's mel filterbank as torchaudio.compliance.kaldi.get_mel_banks builds it for `args.fbank` at
/// args.sample_rate (vtln_warp 1): n_mels = fbank.num_mel_bins bands (no energy column), n_freqs = padded/2 + 1 bins
/// of which the last (Nyquist) has weight 0 in every band, triangles on Kaldi's mel scale (1127 ln(1 + f/700)) with
/// num_mel_bins + 2 edges equally spaced between low_freq and effective_high_freq. Computed in float32 in torch's
/// operation order (edges low + b * delta, each bin's mel 1127 * logf(1 + (bin_width * k) / 700), slopes (mel -
/// left) / (center - left) and (right - mel) / (right - center), max(0, min(up, down))), so the weights equal
/// torchaudio's up to its vectorised log (SLEEF, within 1 ulp of logf). Throws InvalidArgument when args.fbank is
/// invalid at args.sample_rate.
Filterbank build_kaldi_filterbank(const MelArgs& args);

/// The warning for the bands of `args`'s filterbank that contain no FFT bin, worded as torchaudio's ("At least one
/// mel filterbank has all zero values ...") and naming the bands, n_mels, n_fft and the bin spacing; "" when every
/// band has a bin. Uses cached_filterbank; throws as build_filterbank does.
std::string empty_bands_warning(const MelArgs& args);

/// Returns the filterbank for `args`, built once per distinct configuration (keyed on the features and every
/// parameter the bank depends on: the mel fields, or the sample rate and FbankArgs::to_string) and cached for the
/// process.
/// Thread-safe; the returned pointer stays valid for the life of the process.
std::shared_ptr<const Filterbank> cached_filterbank(const MelArgs& args);

}  // namespace melforge::mel
