#pragma once
/// Bodies of the CUDA augmenter's kernels as `__host__ __device__` functions (MELFORGE_AUG_HD), each taking its
/// block and thread indices explicitly: the `__global__` wrappers of augment_cuda.cu pass blockIdx / threadIdx, the
/// CPU tests loop over the same grids. CUDA-free (Complex stands for cufftComplex).
#include <cstdint>

#include "augment_cuda.h"
#include "augment_math.h"

namespace melforge::augment::cuda {

/// Arguments of the block kernels of one overlap-add chunk.
struct ChunkArgs {
  /// Packed signal of the device batch.
  const float* signal = nullptr;
  /// Output buffer the overlap-add accumulates into.
  float* out = nullptr;
  /// [capacity][fft_size] zero-padded blocks (gather), then their inverse FFTs (overlap-add).
  float* blocks = nullptr;
  /// [capacity][fft_size / 2 + 1] spectra of the blocks.
  Complex* spectra = nullptr;
  /// Concatenated impulse-response spectra.
  const Complex* rir_spectra = nullptr;
  /// The chunk's entries: table[0, count).
  const OlaBlock* table = nullptr;
  /// Entries of the chunk.
  int64_t count = 0;
  /// Blocks of the plans (chunk_blocks(fft_size)); blocks count..capacity-1 are zeros.
  int64_t capacity = 0;
  /// FFT size.
  int64_t fft_size = 0;
  /// 1 / fft_size.
  float scale = 0.0f;
};

/// Flat thread index of a one-dimensional launch.
MELFORGE_AUG_HD int64_t flat_index(int64_t block, int thread, int block_dim) {
  return block * block_dim + thread;
}

/// Gather, one thread per element of [capacity][fft_size]: sample j of block c is signal sample c's block * hop + j
/// of its item when j < hop and inside the item, else 0.
MELFORGE_AUG_HD void gather_element(const ChunkArgs& a, int64_t block, int thread, int block_dim) {
  const int64_t i = flat_index(block, thread, block_dim);
  if (i >= a.capacity * a.fft_size) return;
  const int64_t c = i / a.fft_size;
  const int64_t j = i % a.fft_size;
  float v = 0.0f;
  if (c < a.count) {
    const OlaBlock& b = a.table[c];
    const int64_t s = b.block * b.hop + j;
    if (j < b.hop && s < b.frames) v = a.signal[b.offset + s];
  }
  a.blocks[i] = v;
}

/// Product, one thread per bin of [count][fft_size / 2 + 1]: the block's spectrum times its impulse response's,
/// scaled by 1 / fft_size (spectrum_product), in place.
MELFORGE_AUG_HD void product_element(const ChunkArgs& a, int64_t block, int thread, int block_dim) {
  const int64_t bins = a.fft_size / 2 + 1;
  const int64_t i = flat_index(block, thread, block_dim);
  if (i >= a.count * bins) return;
  const int64_t c = i / bins;
  const Complex x = a.spectra[i];
  const Complex h = a.rir_spectra[a.table[c].spectrum_offset + i % bins];
  Complex y{};
  spectrum_product(x.re, x.im, h.re, h.im, a.scale, &y.re, &y.im);
  a.spectra[i] = y;
}

/// Overlap-add, one thread per element of [count][fft_size] of the inverse FFTs: sample j of block c lands at
/// ola_target(). The thread of j < hop owns its target: out = (out + previous block's sample j + hop, when that
/// block is in this chunk) + this block's sample j, the CPU's order of adding blocks. The thread of j >= hop adds
/// this block's sample j only when the next block is not in this chunk (else that block's thread adds it).
MELFORGE_AUG_HD void overlap_add_element(const ChunkArgs& a, int64_t block, int thread, int block_dim) {
  const int64_t i = flat_index(block, thread, block_dim);
  if (i >= a.count * a.fft_size) return;
  const int64_t c = i / a.fft_size;
  const int64_t j = i % a.fft_size;
  const OlaBlock& b = a.table[c];
  const int64_t t = ola_target(b.block, j, b.hop, b.direct);
  if (t < 0 || t >= b.frames) return;
  float* y = a.out + b.offset + t;
  if (j < b.hop) {
    float acc = *y;
    if (b.prev_in_chunk != 0 && j + b.hop < a.fft_size) acc = acc + a.blocks[i - a.fft_size + b.hop];
    *y = acc + a.blocks[i];
  } else if (b.last_in_chunk != 0) {
    *y = *y + a.blocks[i];
  }
}

/// Arguments of the per-item kernels (energy, mix) of one device batch.
struct ItemArgs {
  /// Packed signal; the mix writes its result here.
  float* signal = nullptr;
  /// Reverberated signal of the items with ItemParams::reverb.
  const float* out = nullptr;
  /// Noise bank.
  const float* noise = nullptr;
  /// Per-item table [items].
  const ItemParams* items = nullptr;
  /// Per-item [noise factor, gain amplitude] [items][2] (mix only).
  const float* scales = nullptr;
  /// [energy_frames][2] signal and noise energy per active-power frame (energy only).
  double* energy = nullptr;
  /// Items of the batch (gridDim.y).
  int64_t count = 0;
  /// Samples per active-power frame.
  int64_t frame_samples = 0;
};

/// The item's signal before the noise: the reverberated one or the packed input.
MELFORGE_AUG_HD const float* item_source(const ItemArgs& a, const ItemParams& p) {
  return (p.reverb != 0 ? a.out : a.signal) + p.offset;
}

/// The noise sample mixed into the item's sample t.
MELFORGE_AUG_HD float item_noise(const ItemArgs& a, const ItemParams& p, int64_t t) {
  return a.noise[p.noise_begin + loop_index(p.noise_offset, t, p.noise_size)];
}

/// Energy partial sums of thread `thread` of `block_dim` over frame f of item `item`: sum of x^2 and of n^2 (in
/// double) over the frame's samples thread, thread + block_dim, ...; the kernel reduces them over the block.
MELFORGE_AUG_HD void energy_partial(const ItemArgs& a, int64_t item, int64_t f, int thread, int block_dim,
                                    double* signal_sum, double* noise_sum) {
  const ItemParams& p = a.items[item];
  const float* x = item_source(a, p);
  const int64_t begin = f * a.frame_samples;
  const int64_t end = begin + a.frame_samples < p.frames ? begin + a.frame_samples : p.frames;
  double s = 0.0;
  double n = 0.0;
  for (int64_t t = begin + thread; t < end; t += block_dim) {
    const double v = x[t];
    s += v * v;
    if (p.noise != 0) {
      const double w = item_noise(a, p, t);
      n += w * w;
    }
  }
  *signal_sum = s;
  *noise_sum = n;
}

/// Active-power frames of an item of `frames` samples: ceil(frames / frame_samples).
MELFORGE_AUG_HD int64_t energy_frame_count(int64_t frames, int64_t frame_samples) {
  return (frames + frame_samples - 1) / frame_samples;
}

/// Mix and gain of sample t of item `item`: mix_sample with the item's noise factor (when it has noise), then
/// gain_sample with its amplitude, from item_source() into the packed signal.
MELFORGE_AUG_HD void mix_element(const ItemArgs& a, int64_t item, int64_t t) {
  const ItemParams& p = a.items[item];
  if (t >= p.frames) return;
  float x = item_source(a, p)[t];
  if (p.noise != 0) x = mix_sample(x, item_noise(a, p, t), a.scales[2 * item]);
  a.signal[p.offset + t] = gain_sample(x, a.scales[2 * item + 1]);
}

}  // namespace melforge::augment::cuda
