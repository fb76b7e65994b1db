#pragma once
/// Internals of the CPU (FFTW) engine that tests may inspect. Build the engine with make_cpu_engine (mel_engine.h).
#include "mel/mel_engine.h"

namespace melforge::mel {

/// Frames the CPU engine transforms per batched FFTW call for a segment of `n_frames` frames of `n_fft` samples:
/// about 128 KiB of input per block, at most n_frames. A segment is cut into blocks of this many frames, the last one
/// shorter when n_frames is not a multiple of it.
int cpu_block_frames(int n_frames, int n_fft);

/// The CPU engine's log stage, in place on `count` mel energies: log_compress (mel_math.h) for `args.log`, with the
/// logarithm evaluated branch-free so that the loop vectorises. It agrees with log_compress to a few float32 ulps,
/// and exactly at and below the floor (db: x <= amin; ln: x == 0), so that silence gives exactly silence_value(args).
/// Infinity and NaN pass through.
void cpu_log_compress(float* values, int64_t count, const MelArgs& args);

/// The CPU engine's power stage: out[k * stride + f] = |X_f[k]|^power for frames f < count and bins k < n_freqs,
/// where spectrum holds `count` spectra of n_freqs interleaved (re, im) float pairs one after another (FFTW's r2c
/// output, [count][n_freqs][2]) and stride >= count. With `tiles` (and power 2 on a CPU with AVX2) the bins are
/// squared and transposed in 8 x 8 register tiles; the values are bitwise those of spectral_power (mel_math.h) either
/// way. Returns whether tiles were used.
bool cpu_power_transposed(const float* spectrum, int count, int n_freqs, float power, float* out, int64_t stride,
                          bool tiles = true);

}  // namespace melforge::mel
