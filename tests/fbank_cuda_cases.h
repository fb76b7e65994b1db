#pragma once
/// Kaldi fbank parameter sets and clip lengths of the CUDA fbank tests, shared by the `[cuda]` test (CUDA engine
/// against the CPU engine) and the CPU test of the fbank kernel bodies: the sets a recipe uses (80 bins at 16 kHz,
/// 128 bins AST-style) and one per option the kernels branch on (energy raw or not, htk_compat, snip_edges false,
/// subtract_mean, dither, use_power false, use_log_fbank false).
#include <cstdint>
#include <string>
#include <vector>

#include "fbank/fbank_args.h"
#include "mel/mel_args.h"
#include "mel/mel_engine.h"

namespace melforge::test {

/// One fbank test set: parameters, sample rate, the segment length of compute() (and of the engines' frames per FFT
/// batch) and the CUDA device batch.
struct FbankCase {
  std::string name;
  fbank::FbankArgs fbank;
  int sample_rate = 16000;
  int64_t segment_samples = 4000;
  int64_t device_batch = 3;

  /// MelArgs of the set (MelArgs::use_fbank).
  mel::MelArgs mel() const {
    mel::MelArgs a;
    a.sample_rate = sample_rate;
    a.use_fbank(fbank);
    return a;
  }
  /// Engine configuration of the set for `dtype` (two CPU threads).
  mel::EngineConfig config(mel::DType dtype) const {
    mel::EngineConfig c;
    c.mel = mel();
    c.segment_samples = segment_samples;
    c.dtype = dtype;
    c.threads = 2;
    c.device_batch = device_batch;
    return c;
  }
};

inline FbankCase fbank_case_80_hamming() {
  FbankCase c{"80 bins at 16 kHz, hamming, dither 0", {}, 16000, 4000, 3};
  c.fbank.num_mel_bins = 80;
  c.fbank.window_type = fbank::KaldiWindow::hamming;
  return c;
}

inline FbankCase fbank_case_128_hanning_htk() {
  FbankCase c{"128 bins hanning, use_energy raw, htk_compat (energy last), energy_floor 0", {}, 16000, 3200, 2};
  c.fbank.num_mel_bins = 128;
  c.fbank.window_type = fbank::KaldiWindow::hanning;
  c.fbank.use_energy = true;
  c.fbank.htk_compat = true;
  c.fbank.energy_floor = 0.0;
  return c;
}

inline FbankCase fbank_case_energy_raw() {
  FbankCase c{"povey 23 bins, use_energy raw (energy first), energy_floor 1", {}, 16000, 4000, 3};
  c.fbank.use_energy = true;
  return c;
}

inline FbankCase fbank_case_energy_not_raw() {
  FbankCase c{"povey 40 bins at 8 kHz, use_energy after window (raw_energy false), blackman", {}, 8000, 2000, 4};
  c.fbank.num_mel_bins = 40;
  c.fbank.use_energy = true;
  c.fbank.raw_energy = false;
  c.fbank.window_type = fbank::KaldiWindow::blackman;
  return c;
}

inline FbankCase fbank_case_no_snip() {
  FbankCase c{"snip_edges false (mirrored edges), 40 bins at 8 kHz, rectangular, no DC removal", {}, 8000, 2000, 2};
  c.fbank.num_mel_bins = 40;
  c.fbank.snip_edges = false;
  c.fbank.window_type = fbank::KaldiWindow::rectangular;
  c.fbank.remove_dc_offset = false;
  return c;
}

inline FbankCase fbank_case_subtract_mean() {
  FbankCase c{"subtract_mean with use_energy, 80 bins, snip_edges false", {}, 16000, 4000, 2};
  c.fbank.num_mel_bins = 80;
  c.fbank.use_energy = true;
  c.fbank.subtract_mean = true;
  c.fbank.snip_edges = false;
  return c;
}

inline FbankCase fbank_case_dither() {
  FbankCase c{"dither 1 seed 7, preemphasis 0.5, frame 20 ms shift 12.5 ms", {}, 16000, 4000, 3};
  c.fbank.dither = 1.0;
  c.fbank.dither_seed = 7;
  c.fbank.preemphasis_coefficient = 0.5;
  c.fbank.frame_length = 20.0;
  c.fbank.frame_shift = 12.5;
  return c;
}

inline FbankCase fbank_case_magnitude() {
  FbankCase c{"use_power false, no round_to_power_of_two (n_fft 400), low 64 high -400", {}, 16000, 4000, 3};
  c.fbank.use_power = false;
  c.fbank.round_to_power_of_two = false;
  c.fbank.low_freq = 64.0;
  c.fbank.high_freq = -400.0;
  return c;
}

inline FbankCase fbank_case_linear() {
  FbankCase c{"use_log_fbank false (linear energies), use_energy, preemphasis 0", {}, 16000, 4000, 3};
  c.fbank.use_log_fbank = false;
  c.fbank.use_energy = true;
  c.fbank.preemphasis_coefficient = 0.0;
  return c;
}

/// Every set above.
inline std::vector<FbankCase> fbank_cases() {
  return {fbank_case_80_hamming(), fbank_case_128_hanning_htk(), fbank_case_energy_raw(),
          fbank_case_energy_not_raw(), fbank_case_no_snip(),        fbank_case_subtract_mean(),
          fbank_case_dither(),         fbank_case_magnitude(),      fbank_case_linear()};
}

/// Clip lengths of a ragged batch at 8-16 kHz: empty and 1-sample clips, clips shorter than a window (25 ms is 200
/// samples at 8 kHz, 400 at 16 kHz), around a window and a shift, and longer clips spanning several FFT launches.
inline const std::vector<int64_t> kFbankClipLengths = {0,   1,   3,    79,   80,  150,  199, 200,  201,  399,
                                                       400, 401, 560,  4000, 0,   12345, 2,  7001, 159,  161};

}  // namespace melforge::test
