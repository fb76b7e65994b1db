#pragma once
/// Internals of the CPU (FFTW) engine that tests may inspect. Build the engine with make_cpu_engine (mel_engine.h).
#include "mel/mel_engine.h"

namespace melforge::mel {

/// Frames the CPU engine transforms per batched FFTW call for a segment of `n_frames` frames of `n_fft` samples:
/// about 128 KiB of input per block, at most n_frames. A segment is cut into blocks of this many frames, the last one
/// shorter when n_frames is not a multiple of it.
int cpu_block_frames(int n_frames, int n_fft);

/// Element counts of one CPU thread's working memory for blocks of `block` frames. The one place where the CPU
/// engine's buffers are sized.
struct CpuScratchSizes {
  /// Padded samples under a block's edge frames: (block - 1) * hop + n_fft floats.
  int64_t padded_floats = 0;
  /// Windowed frames [block][n_fft], floats.
  int64_t frame_floats = 0;
  /// Spectra [block][n_freqs], complex floats (8 bytes each).
  int64_t spectrum_complex = 0;
  /// |X|^power [n_freqs][block], floats.
  int64_t power_floats = 0;
  /// Mel energies [n_mels][block], floats (fbank: n_mels = bins, the energy column's row included).
  int64_t mel_floats = 0;
  /// fbank: a frame's samples gathered from its mirrored or zero-padded edges, window floats; 0 for mel.
  int64_t gather_floats = 0;
  /// fbank: a frame after dither, window floats; 0 for mel.
  int64_t prep_floats = 0;
  /// fbank with subtract_mean: one segment's float output [n_mels][n_frames] (compute() subtracts its mean before
  /// the dtype conversion); 0 otherwise.
  int64_t segment_floats = 0;
  /// Bytes of all of them.
  int64_t bytes() const {
    return (padded_floats + frame_floats + 2 * spectrum_complex + power_floats + mel_floats + gather_floats +
            prep_floats + segment_floats) *
           static_cast<int64_t>(sizeof(float));
  }
};

/// Sizes for blocks of `block` frames of `n_fft` samples, hop `hop`, `n_freqs` bins and `n_mels` bands (mel).
CpuScratchSizes cpu_scratch_sizes(int block, int n_fft, int hop, int n_freqs, int n_mels);

/// Sizes of one thread's scratch for an engine of `config` (mel or fbank), blocks of cpu_block_frames frames.
/// Throws InvalidArgument as make_layout does.
CpuScratchSizes cpu_scratch_sizes(const EngineConfig& config);

/// Host bytes a CPU engine of `config` holds (MelEngine::host_bytes): one cpu_scratch_sizes(config) per thread plus
/// the window (mel: n_fft floats; fbank: window floats). Throws InvalidArgument as make_layout does. Not counted:
/// compute_clips with fbank subtract_mean and float16 output converts through a transient float copy of the batch's
/// output (ClipBatch::out_elems() floats) that lives for the call only.
int64_t cpu_engine_host_bytes(const EngineConfig& config);

/// The CPU engine's log stage, in place on `count` mel energies: log_compress (mel_math.h) for `args.log` (fbank:
/// kaldi_log with use_log_fbank, else none), with the logarithm evaluated branch-free so that the loop vectorises. It
/// agrees with log_compress to a few float32 ulps, and exactly at and below the floor (db: x <= amin; ln: x == 0), so
/// that silence gives exactly silence_value(args). Infinity and NaN pass through.
void cpu_log_compress(float* values, int64_t count, const MelArgs& args);

/// The CPU engine's power stage: out[k * stride + f] = |X_f[k]|^power for frames f < count and bins k < n_freqs,
/// where spectrum holds `count` spectra of n_freqs interleaved (re, im) float pairs one after another (FFTW's r2c
/// output, [count][n_freqs][2]) and stride >= count. With `tiles` (and power 2 on a CPU with AVX2) the bins are
/// squared and transposed in 8 x 8 register tiles; the values are bitwise those of spectral_power (mel_math.h) either
/// way. Returns whether tiles were used.
bool cpu_power_transposed(const float* spectrum, int count, int n_freqs, float power, float* out, int64_t stride,
                          bool tiles = true);

}  // namespace melforge::mel
