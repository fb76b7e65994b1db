#pragma once
/// Per-element bodies of the CUDA mel kernels as `__host__ __device__` functions. Each takes its block and thread
/// indices explicitly: the `__global__` wrappers in mel_cuda.cu pass blockIdx/threadIdx, and the CPU tests loop
/// over the same grid (same block size, same block count) with g++. Needs the CUDA include path (cuda_fp16.h).
#include <cstdint>
#include <vector>

#include <cuda_fp16.h>
#include <vector_types.h>

#include "mel_args.h"
#include "mel_cuda.h"
#include "mel_math.h"

namespace melforge::mel::cuda {

/// Window value at position n in [0, n_fft) of a frame: the periodic window of length `win` (<= n_fft), zero-padded
/// on both sides to n_fft with (n_fft - win) / 2 zeros on the left, as torch.stft pads it.
MELFORGE_HD float padded_window(int n, int n_fft, int win, Window window) {
  const int j = n - (n_fft - win) / 2;
  if (j < 0 || j >= win) return 0.0f;
  return window == Window::hamming ? hamming(j, win) : hann(j, win);
}

/// Host: the [n_fft] window table the gather kernel reads, from padded_window().
inline std::vector<float> window_table(const MelArgs& args) {
  std::vector<float> w(static_cast<size_t>(args.n_fft));
  for (int n = 0; n < args.n_fft; ++n) {
    w[static_cast<size_t>(n)] = padded_window(n, args.n_fft, args.win(), args.window);
  }
  return w;
}

/// Arguments of the gather kernel: one batch's segments to windowed, padded frames.
struct GatherParams {
  /// [batch][segment_samples] input samples.
  const float* input = nullptr;
  /// [n_fft] window from padded_window().
  const float* window = nullptr;
  /// [batch * n_frames][n_fft] output frames.
  float* frames = nullptr;
  /// Samples per segment.
  int64_t segment_samples = 0;
  /// FFT rows: batch * n_frames (the grid size).
  int64_t frame_rows = 0;
  /// FFT size, samples.
  int n_fft = 0;
  /// Hop between frames, samples.
  int hop = 0;
  /// Padding on each side of a segment, samples (n_fft/2 when centred, else 0).
  int pad = 0;
  /// Frames per segment.
  int n_frames = 0;
  /// Reflect padding (true) or zero padding (false).
  bool reflect = true;
};

/// Gather body for block `block` (= FFT row: segment row / n_frames, frame row % n_frames) and thread `thread` of
/// `block_dim`: writes frames[row][n] = window[n] * padded segment sample (t*hop + n) for n = thread, thread +
/// block_dim, ... < n_fft.
MELFORGE_HD void gather_frame(const GatherParams& p, int64_t block, int thread, int block_dim) {
  if (block >= p.frame_rows) return;
  const int64_t segment = block / p.n_frames;
  const int64_t start = (block % p.n_frames) * p.hop;
  const float* x = p.input + segment * p.segment_samples;
  float* frame = p.frames + block * p.n_fft;
  for (int n = thread; n < p.n_fft; n += block_dim) {
    frame[n] = p.window[n] * padded_sample(x, p.segment_samples, start + n, p.pad, p.reflect);
  }
}

/// Arguments of the clip gather kernel: one clip launch's pieces to windowed, padded frames.
struct ClipGatherParams {
  /// The launch's input samples (CudaClipSizes::staging_input_floats), pieces' samples one after another.
  const float* input = nullptr;
  /// The launch's header.
  const ClipLaunchHeader* header = nullptr;
  /// [header->pieces] pieces, rows increasing.
  const ClipPiece* pieces = nullptr;
  /// [n_fft] window from padded_window().
  const float* window = nullptr;
  /// [rows][n_fft] output frames.
  float* frames = nullptr;
  /// FFT rows of a launch (the grid size): CudaClipSizes::rows.
  int64_t rows = 0;
  /// FFT size, samples.
  int n_fft = 0;
  /// Hop between frames, samples.
  int hop = 0;
  /// Padding on each side of a clip, samples (n_fft/2 when centred, else 0).
  int pad = 0;
};

/// Index of the piece holding `row`: the last of pieces[0, count) whose first row is <= row (count >= 1, rows
/// increasing, pieces[0].row == 0).
MELFORGE_HD int64_t find_piece(const ClipPiece* pieces, int64_t count, int64_t row) {
  int64_t lo = 0;
  int64_t hi = count;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pieces[mid].row <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// Clip gather body for block `block` (= FFT row) and thread `thread` of `block_dim`: row r < header->rows holds
/// frame t = piece.frame + (r - piece.row) of its piece's clip, frames[r][n] = window[n] * clip sample (t*hop - pad +
/// n), reflected or zero beyond the clip's edges (clip_sample); rows from header->rows on are zero frames.
MELFORGE_HD void gather_clip_frame(const ClipGatherParams& p, int64_t block, int thread, int block_dim) {
  if (block >= p.rows) return;
  float* frame = p.frames + block * p.n_fft;
  const ClipLaunchHeader h = *p.header;
  if (block >= h.rows) {
    for (int n = thread; n < p.n_fft; n += block_dim) frame[n] = 0.0f;
    return;
  }
  const ClipPiece c = p.pieces[find_piece(p.pieces, h.pieces, block)];
  const int64_t start = (c.frame + (block - c.row)) * p.hop - p.pad;
  const float* x = p.input + c.input;
  for (int n = thread; n < p.n_fft; n += block_dim) {
    frame[n] = p.window[n] * clip_sample(x, c.origin, c.samples, start + n, c.reflect != 0);
  }
}

/// Arguments of the mel kernel: spectra to log-mel values.
struct MelParams {
  /// [batch * n_frames][n_freqs] complex spectra (cufftComplex is float2).
  const float2* spectrum = nullptr;
  /// [3 * n_mels + 1] band table: begin[n_mels], end[n_mels], offset[n_mels + 1] (see Filterbank).
  const int32_t* bands = nullptr;
  /// Concatenated band weights.
  const float* weights = nullptr;
  /// Output, IEEE half bits (uint16) when `fp16`, else float: [batch][n_mels][n_frames] (mel_element) or
  /// [rows][n_mels] (mel_frame_element).
  void* out = nullptr;
  /// Output elements: batch * n_mels * n_frames, or rows * n_mels.
  int64_t total = 0;
  /// Mel bands.
  int n_mels = 0;
  /// Frames per segment (mel_element only).
  int n_frames = 0;
  /// One-sided FFT bins per frame.
  int n_freqs = 0;
  /// Spectrogram exponent.
  float power = 2.0f;
  /// static_cast<int>(LogMode), as log_compress() takes it.
  int log_mode = 0;
  /// Floor for db.
  float amin = 1e-10f;
  /// Offset for ln.
  float log_eps = 1e-6f;
  /// Store IEEE half bits (true) or float (false).
  bool fp16 = true;
};

/// log(sum over band m's bins k of weight * |row[k]|^power) for one FFT row's spectrum `row` ([n_freqs]).
MELFORGE_HD float band_log_mel(const MelParams& p, const float2* row, int m) {
  const int32_t begin = p.bands[m];
  const int32_t end = p.bands[p.n_mels + m];
  const float* w = p.weights + p.bands[2 * p.n_mels + m];
  float acc = 0.0f;
  for (int32_t k = begin; k < end; ++k) {
    const float2 x = row[k];
    acc += w[k - begin] * spectral_power(x.x, x.y, p.power);
  }
  return log_compress(acc, p.log_mode, p.power, p.amin, p.log_eps);
}

/// Stores `v` as output element `o`: IEEE half bits when p.fp16, else float.
MELFORGE_HD void store_mel(const MelParams& p, int64_t o, float v) {
  if (p.fp16) {
    static_cast<uint16_t*>(p.out)[o] = __half_as_ushort(__float2half_rn(v));
  } else {
    static_cast<float*>(p.out)[o] = v;
  }
}

/// Mel body for block `block` and thread `thread` of `block_dim`: output element o = block * block_dim + thread,
/// o = (segment * n_mels + m) * n_frames + t, is band_log_mel of band m of FFT row segment * n_frames + t.
MELFORGE_HD void mel_element(const MelParams& p, int64_t block, int thread, int block_dim) {
  const int64_t o = block * block_dim + thread;
  if (o >= p.total) return;
  const int64_t t = o % p.n_frames;
  const int64_t segment_band = o / p.n_frames;
  const int m = static_cast<int>(segment_band % p.n_mels);
  const int64_t segment = segment_band / p.n_mels;
  store_mel(p, o, band_log_mel(p, p.spectrum + (segment * p.n_frames + t) * p.n_freqs, m));
}

/// Frame-major mel body (clip launches: output [rows][n_mels], n_frames unused): output element o = block * block_dim
/// + thread = row * n_mels + m is band_log_mel of band m of FFT row `row`.
MELFORGE_HD void mel_frame_element(const MelParams& p, int64_t block, int thread, int block_dim) {
  const int64_t o = block * block_dim + thread;
  if (o >= p.total) return;
  const int64_t row = o / p.n_mels;
  const int m = static_cast<int>(o % p.n_mels);
  store_mel(p, o, band_log_mel(p, p.spectrum + row * p.n_freqs, m));
}

}  // namespace melforge::mel::cuda
