#pragma once
/// The per-element math of the waveform augmentation, shared by the CPU augmenter (augment_cpu.cpp), the CUDA
/// kernels (augment_cuda.cu) and the tests. Every function here is `__host__ __device__` under nvcc and plain inline
/// C++ otherwise, so that the CPU tests run the very code the device runs.
///
/// Reverberation is an overlap-add FFT convolution: the impulse response h (unit energy, `rir_len` taps, its direct
/// path at tap d = the largest |h[k]|) is convolved with the signal x in blocks of ola_hop() samples, each block
/// zero-padded to ola_fft_size() points; the output is aligned on the direct path: y[n] = sum_k h[k] x[n + d - k] for
/// n in [0, frames), x being 0 outside [0, frames).
///
/// Tolerance of the CUDA augmenter against the CPU one: the FFTs of cuFFT and FFTW differ in rounding, so outputs
/// match within kCudaAbsTolerance times the largest |sample| of the CPU output (the noise mix, the gain and the
/// overlap-add are the same operations in the same order).
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MELFORGE_AUG_HD __host__ __device__ __forceinline__
#else
#define MELFORGE_AUG_HD inline
#endif

namespace melforge::augment {

/// Tolerance of the CUDA augmenter, relative to the largest |sample| of the CPU augmenter's output (see above).
inline constexpr float kCudaAbsTolerance = 1e-4f;

/// Smallest FFT size of the overlap-add.
inline constexpr int64_t kMinOlaFft = 4096;

/// Amplitude factor of a gain in dB: 10^(db / 20).
MELFORGE_AUG_HD double db_to_amplitude(double db) { return pow(10.0, db / 20.0); }

/// Index into a noise clip of `size` samples for signal sample i, the clip read from `offset` and looped.
MELFORGE_AUG_HD int64_t loop_index(int64_t offset, int64_t i, int64_t size) { return (offset + i) % size; }

/// One mixed sample: the signal plus the noise sample times its factor (noise_factor()).
MELFORGE_AUG_HD float mix_sample(float signal, float noise, float factor) { return signal + factor * noise; }

/// One sample after the gain's amplitude factor.
MELFORGE_AUG_HD float gain_sample(float sample, float amplitude) { return sample * amplitude; }

/// FFT size of the overlap-add for an impulse response of `rir_len` taps: the smallest power of two that is at least
/// 2 * rir_len and at least kMinOlaFft.
MELFORGE_AUG_HD int64_t ola_fft_size(int64_t rir_len) {
  int64_t n = kMinOlaFft;
  while (n < 2 * rir_len) n *= 2;
  return n;
}

/// Signal samples per overlap-add block: ola_fft_size(rir_len) - rir_len + 1 (a block's linear convolution,
/// hop + rir_len - 1 samples, fits the FFT without wrapping).
MELFORGE_AUG_HD int64_t ola_hop(int64_t rir_len) { return ola_fft_size(rir_len) - rir_len + 1; }

/// Blocks of the overlap-add for `frames` signal samples: ceil(frames / hop), at least 0.
MELFORGE_AUG_HD int64_t ola_blocks(int64_t frames, int64_t rir_len) {
  const int64_t hop = ola_hop(rir_len);
  return (frames + hop - 1) / hop;
}

/// One bin of the product of a block's spectrum (ar, ai) and the impulse response's (br, bi), scaled by `scale`
/// (1 / fft size: the unnormalised inverse FFT of both backends then gives the linear convolution). Writes (cr, ci).
MELFORGE_AUG_HD void spectrum_product(float ar, float ai, float br, float bi, float scale, float* cr, float* ci) {
  *cr = (ar * br - ai * bi) * scale;
  *ci = (ar * bi + ai * br) * scale;
}

/// Where sample j of block b's inverse FFT lands in the aligned output: b * hop + j - direct (may fall outside
/// [0, frames); such samples are dropped).
MELFORGE_AUG_HD int64_t ola_target(int64_t block, int64_t j, int64_t hop, int64_t direct) {
  return block * hop + j - direct;
}

}  // namespace melforge::augment
