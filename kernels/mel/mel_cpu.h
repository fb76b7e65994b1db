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

}  // namespace melforge::mel
