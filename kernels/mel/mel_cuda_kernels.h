#pragma once
/// Per-element bodies of the CUDA mel kernels as `__host__ __device__` functions. Each takes its block and thread
/// indices explicitly: the `__global__` wrappers in mel_cuda.cu pass blockIdx/threadIdx, and the CPU tests loop
/// over the same grid (same block size, same block count) with g++. Needs the CUDA include path (cuda_fp16.h).
#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_fp16.h>
#include <vector_types.h>

#include "fbank/fbank_math.h"
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


// ---- Kaldi fbank (MelArgs::features fbank): torchaudio.compliance.kaldi.fbank's per-frame pipeline. ----

/// Host: the [n_fft] window table of the fbank gather kernels: Kaldi's symmetric window of window_size samples
/// (fbank_math.h's kaldi_window) at positions [0, window_size), zeros after it (the frame is zero-padded on the right
/// to padded_window_size = n_fft, as torchaudio pads it).
inline std::vector<float> fbank_window_table(const MelArgs& args) {
  const fbank::FbankArgs& f = args.fbank;
  const int win = f.window_size(args.sample_rate);
  std::vector<float> w(static_cast<size_t>(args.n_fft), 0.0f);
  for (int n = 0; n < win && n < args.n_fft; ++n) {
    w[static_cast<size_t>(n)] = fbank::kaldi_window(static_cast<int>(f.window_type), n, win, f.blackman_coeff);
  }
  return w;
}

/// Arguments of the fbank gather kernels (segments and clip launches): samples to pre-processed, windowed, padded
/// frames [rows][n_fft] and their log energies [rows]. One block per FFT row.
struct FbankFrameParams {
  /// Segments: [batch][segment_samples]. Clip launches: the launch's input (pieces' samples one after another).
  const float* input = nullptr;
  /// Clip launches: the launch's header; nullptr for segments.
  const ClipLaunchHeader* header = nullptr;
  /// Clip launches: [header->pieces] pieces, rows increasing; nullptr for segments.
  const ClipPiece* pieces = nullptr;
  /// [n_fft] window from fbank_window_table().
  const float* window = nullptr;
  /// [rows][n_fft] output frames.
  float* frames = nullptr;
  /// [rows] log energy of each frame (kaldi_log_energy); nullptr when use_energy is false.
  float* energy = nullptr;
  /// FFT rows (the grid size): batch * n_frames for segments, CudaClipSizes::rows for clip launches.
  int64_t rows = 0;
  /// Segments: samples per segment.
  int64_t segment_samples = 0;
  /// Segments: frames per segment.
  int n_frames = 1;
  /// FFT size (padded_window_size), samples.
  int n_fft = 0;
  /// Frame length (window_size), samples, <= n_fft.
  int win = 0;
  /// Frame shift (window_shift), samples.
  int shift = 1;
  /// Start of frame 0 relative to its clip: 0 (snip_edges) or -(win / 2 - shift / 2).
  int first_start = 0;
  /// Kaldi mirroring at the clip's edges (snip_edges false); else zeros beyond them.
  bool mirror = false;
  /// Standard deviation of the dither noise; 0 adds none.
  float dither = 0.0f;
  /// Seed of the dither noise (dither_gauss).
  uint64_t dither_seed = 0;
  /// Subtract each frame's mean before the energy and the pre-emphasis.
  bool remove_dc_offset = true;
  /// Pre-emphasis coefficient; 0 leaves the frame as it is.
  float preemphasis = 0.0f;
  /// Energy before pre-emphasis and window (true) or of the windowed, padded frame (false).
  bool raw_energy = true;
  /// log(energy_floor): the floor of the log energy when `floored`.
  float log_energy_floor = 0.0f;
  /// energy_floor > 0.
  bool floored = false;
};

/// Where FFT row `row` reads its samples: clip sample i (0 <= i < len) is x[i - origin]; t is the frame's index in
/// its clip (or segment) and `start` the clip position of its first sample. `valid` is false for a padding row of a
/// clip launch (row >= header->rows), whose frame is zeros.
struct FbankFrameSource {
  /// Samples at hand: clip sample `origin` at x[0].
  const float* x = nullptr;
  /// First clip sample at hand.
  int64_t origin = 0;
  /// Samples of the whole clip (segment).
  int64_t len = 0;
  /// Frame index in the clip (segment): the dither's frame argument.
  int64_t t = 0;
  /// Clip position of the frame's sample 0 (negative or past len only with mirroring, or past len for a clip
  /// zero-padded to one frame).
  int64_t start = 0;
  /// False for a padding row.
  bool valid = false;
};

/// The source of row `row` (< p.rows): the segment row / n_frames and frame row % n_frames, or the clip launch's
/// piece holding the row (find_piece).
MELFORGE_HD FbankFrameSource fbank_frame_source(const FbankFrameParams& p, int64_t row) {
  FbankFrameSource s;
  if (p.header == nullptr) {
    const int64_t segment = row / p.n_frames;
    s.x = p.input + segment * p.segment_samples;
    s.len = p.segment_samples;
    s.t = row % p.n_frames;
  } else {
    const ClipLaunchHeader h = *p.header;
    if (row >= h.rows || h.pieces < 1) return s;
    const ClipPiece c = p.pieces[find_piece(p.pieces, h.pieces, row)];
    s.x = p.input + c.input;
    s.origin = c.origin;
    s.len = c.samples;
    s.t = c.frame + (row - c.row);
  }
  s.start = s.t * p.shift + p.first_start;
  s.valid = true;
  return s;
}

/// Sample j (0 <= j < win) of the frame of `s` after dither, before the DC removal: the clip sample at s.start + j
/// (Kaldi's mirror image when p.mirror, kaldi_mirror_index; zero outside the clip otherwise) plus dither *
/// dither_gauss(seed, t, j).
MELFORGE_HD float fbank_raw_sample(const FbankFrameParams& p, const FbankFrameSource& s, int j) {
  const int64_t pos = s.start + j;
  int64_t i = pos;
  if (p.mirror) {
    i = fbank::kaldi_mirror_index(pos, s.len);
  } else if (pos < 0 || pos >= s.len) {
    i = -1;
  }
  float v = i >= 0 ? s.x[i - s.origin] : 0.0f;
  if (p.dither != 0.0f) v = v + p.dither * fbank::dither_gauss(p.dither_seed, s.t, j);
  return v;
}

/// Phase 1 of the fbank gather for thread `thread` of `block_dim`: its part of the frame's sum of raw samples (j =
/// thread, thread + block_dim, ... < win), in double as the CPU engine sums. The block's sum over threads
/// (tree_level's order), rounded to float and divided by win, is the frame's mean.
MELFORGE_HD double fbank_partial_sum(const FbankFrameParams& p, const FbankFrameSource& s, int thread,
                                     int block_dim) {
  double acc = 0.0;
  if (!s.valid) return acc;
  for (int j = thread; j < p.win; j += block_dim) acc += static_cast<double>(fbank_raw_sample(p, s, j));
  return acc;
}

/// Phase 2 (raw_energy): this thread's part of the sum of squares of the frame after DC removal (raw sample - mean),
/// each square rounded to float, summed in double.
MELFORGE_HD double fbank_partial_raw_energy(const FbankFrameParams& p, const FbankFrameSource& s, float mean,
                                            int thread, int block_dim) {
  double acc = 0.0;
  if (!s.valid) return acc;
  for (int j = thread; j < p.win; j += block_dim) {
    const float u = fbank_raw_sample(p, s, j) - mean;
    acc += static_cast<double>(u * u);
  }
  return acc;
}

/// Phase 3: writes this thread's samples n = thread, thread + block_dim, ... < n_fft of row `row`'s frame: for n < win
/// window[n] * (u[n] - preemphasis * u[n - 1]) with u = raw sample - mean and u[-1] = u[0] (each value recomputed
/// from the input, so no thread reads another's output); zeros for n >= win and for a padding row. Returns this
/// thread's part of the sum of squares of what it wrote, in double (the energy when raw_energy is false).
MELFORGE_HD double fbank_write_frame(const FbankFrameParams& p, const FbankFrameSource& s, float mean, int64_t row,
                                     int thread, int block_dim) {
  float* frame = p.frames + row * p.n_fft;
  double acc = 0.0;
  for (int n = thread; n < p.n_fft; n += block_dim) {
    float y = 0.0f;
    if (s.valid && n < p.win) {
      const float u = fbank_raw_sample(p, s, n) - mean;
      const float prev = fbank_raw_sample(p, s, n > 0 ? n - 1 : 0) - mean;
      y = p.window[n] * (u - p.preemphasis * prev);
    }
    frame[n] = y;
    acc += static_cast<double>(y * y);
  }
  return acc;
}

/// Sums a[0, n) in place by halving (n a power of two): a[i] += a[i + h] for h = n/2, n/4, ..., 1, i < h; the sum is
/// a[0]. The device does the same additions in the same order, one level per __syncthreads (mel_cuda.cu).
MELFORGE_HD void tree_level(double* a, int i, int h) { a[i] = a[i] + a[i + h]; }

/// The frame's log energy from the sum of squares `energy` (rounded to float, then kaldi_log_energy with the params'
/// floor).
MELFORGE_HD float fbank_frame_log_energy(const FbankFrameParams& p, double energy) {
  return fbank::kaldi_log_energy(static_cast<float>(energy), p.log_energy_floor, p.floored);
}

/// Host: the FbankFrameParams fields that come from `args` (features fbank): sizes, edges, dither, DC removal,
/// pre-emphasis and energy; the buffers and `rows`, `segment_samples`, `n_frames` are left to the caller.
inline FbankFrameParams fbank_frame_params(const MelArgs& args) {
  const fbank::FbankArgs& f = args.fbank;
  FbankFrameParams p;
  p.n_fft = args.n_fft;
  p.win = f.window_size(args.sample_rate);
  p.shift = f.window_shift(args.sample_rate);
  p.first_start = static_cast<int>(f.frame_start(0, args.sample_rate));
  p.mirror = !f.snip_edges;
  p.dither = static_cast<float>(f.dither);
  p.dither_seed = f.dither_seed;
  p.remove_dc_offset = f.remove_dc_offset;
  p.preemphasis = static_cast<float>(f.preemphasis_coefficient);
  p.raw_energy = f.raw_energy;
  p.floored = f.energy_floor > 0.0;
  p.log_energy_floor = p.floored ? static_cast<float>(std::log(f.energy_floor)) : 0.0f;
  return p;
}

/// Arguments of the fbank mel kernels: spectra and frame energies to output columns.
struct FbankMelParams {
  /// [rows][n_freqs] complex spectra.
  const float2* spectrum = nullptr;
  /// [3 * n_bands + 1] band table of the Kaldi filterbank: begin[n_bands], end[n_bands], offset[n_bands + 1].
  const int32_t* bands = nullptr;
  /// Concatenated band weights.
  const float* weights = nullptr;
  /// [rows] frame log energies; read only when energy_column >= 0.
  const float* energy = nullptr;
  /// Output: [batch][n_cols][n_frames] (fbank_mel_element) or [rows][n_cols] (fbank_mel_frame_element); float when
  /// `float_out` (the input of the subtract_mean kernels), else MelParams::fp16's types.
  void* out = nullptr;
  /// Output elements.
  int64_t total = 0;
  /// Output columns: n_bands, plus one with use_energy (MelArgs::n_mels).
  int n_cols = 0;
  /// Mel bins of the filterbank (num_mel_bins).
  int n_bands = 0;
  /// Column of the log energy: 0 (first), n_bands (last, htk_compat), -1 (no use_energy).
  int energy_column = -1;
  /// Frames per segment (fbank_mel_element only).
  int n_frames = 1;
  /// One-sided FFT bins per frame.
  int n_freqs = 0;
  /// |X|^2 (true) or |X|.
  bool use_power = true;
  /// kaldi_log of the mel energies.
  bool use_log = true;
  /// Store float (true), or IEEE half bits / float by `fp16`.
  bool float_out = false;
  /// With float_out false: half bits (true) or float.
  bool fp16 = true;
};

/// Host: the FbankMelParams fields that come from `args` (features fbank): columns, bands, energy column, bins,
/// power and log; the buffers, `total`, `n_frames` and the output type are left to the caller.
inline FbankMelParams fbank_mel_params(const MelArgs& args) {
  const fbank::FbankArgs& f = args.fbank;
  FbankMelParams p;
  p.n_cols = f.bins();
  p.n_bands = f.num_mel_bins;
  p.energy_column = !f.use_energy ? -1 : (f.htk_compat ? f.num_mel_bins : 0);
  p.n_freqs = args.n_freqs();
  p.use_power = f.use_power;
  p.use_log = f.use_log_fbank;
  return p;
}

/// Value of column `col` of FFT row `row`: the frame's log energy in the energy column, else the (log) Kaldi mel
/// energy of its band: sum over the band's bins k, increasing, of weight * (|X_k|^2 or |X_k|).
MELFORGE_HD float fbank_column_value(const FbankMelParams& p, int64_t row, int col) {
  if (col == p.energy_column) return p.energy[row];
  const int m = p.energy_column == 0 ? col - 1 : col;
  const float2* x = p.spectrum + row * p.n_freqs;
  const int32_t begin = p.bands[m];
  const int32_t end = p.bands[p.n_bands + m];
  const float* w = p.weights + p.bands[2 * p.n_bands + m];
  float acc = 0.0f;
  for (int32_t k = begin; k < end; ++k) {
    const float2 v = x[k];
    const float p2 = v.x * v.x + v.y * v.y;
    acc += w[k - begin] * (p.use_power ? p2 : sqrtf(p2));
  }
  return p.use_log ? fbank::kaldi_log(acc) : acc;
}

/// Stores `v` as output element `o` of a fbank mel kernel: float when float_out, else as store_mel.
MELFORGE_HD void store_fbank(const FbankMelParams& p, int64_t o, float v) {
  if (p.float_out || !p.fp16) {
    static_cast<float*>(p.out)[o] = v;
  } else {
    static_cast<uint16_t*>(p.out)[o] = __half_as_ushort(__float2half_rn(v));
  }
}

/// Segment-layout fbank body: element o = block * block_dim + thread = (segment * n_cols + col) * n_frames + t of
/// FFT row segment * n_frames + t.
MELFORGE_HD void fbank_mel_element(const FbankMelParams& p, int64_t block, int thread, int block_dim) {
  const int64_t o = block * block_dim + thread;
  if (o >= p.total) return;
  const int64_t t = o % p.n_frames;
  const int64_t segment_col = o / p.n_frames;
  const int col = static_cast<int>(segment_col % p.n_cols);
  const int64_t segment = segment_col / p.n_cols;
  store_fbank(p, o, fbank_column_value(p, segment * p.n_frames + t, col));
}

/// Frame-major fbank body (clip launches): element o = row * n_cols + col.
MELFORGE_HD void fbank_mel_frame_element(const FbankMelParams& p, int64_t block, int thread, int block_dim) {
  const int64_t o = block * block_dim + thread;
  if (o >= p.total) return;
  store_fbank(p, o, fbank_column_value(p, o / p.n_cols, static_cast<int>(o % p.n_cols)));
}

/// Arguments of the subtract_mean kernels.
struct FbankMeanParams {
  /// Float values from the fbank mel kernel (float_out): [batch][n_cols][n_frames] or [rows][n_cols].
  const float* values = nullptr;
  /// Output in the engine's dtype (half bits when fp16), same layout as `values`.
  void* out = nullptr;
  /// Clip launches: the header and pieces of the launch; nullptr for segments.
  const ClipLaunchHeader* header = nullptr;
  const ClipPiece* pieces = nullptr;
  /// Clip launches: [pieces capacity][n_cols] doubles: the per-piece column sums (sum kernel) or the column means of
  /// each piece's clip (subtract kernel, float values stored as double).
  double* stats = nullptr;
  /// Segments: batch * n_cols (sum-and-subtract threads). Clip launches: CudaClipSizes::pieces * n_cols (sum kernel)
  /// or rows * n_cols (subtract kernel).
  int64_t total = 0;
  /// Output columns.
  int n_cols = 0;
  /// Segments: frames per segment.
  int n_frames = 1;
  /// Half bits (true) or float output.
  bool fp16 = true;
};

/// Stores `v` as element `o` of a subtract_mean kernel's output.
MELFORGE_HD void store_mean_out(const FbankMeanParams& p, int64_t o, float v) {
  if (p.fp16) {
    static_cast<uint16_t*>(p.out)[o] = __half_as_ushort(__float2half_rn(v));
  } else {
    static_cast<float*>(p.out)[o] = v;
  }
}

/// Segments: thread i = segment * n_cols + col sums its column's n_frames values (double, frame order), takes the
/// float mean and stores every value minus it.
MELFORGE_HD void fbank_segment_mean_element(const FbankMeanParams& p, int64_t block, int thread, int block_dim) {
  const int64_t i = block * block_dim + thread;
  if (i >= p.total) return;
  const int64_t base = i * p.n_frames;
  double sum = 0.0;
  for (int t = 0; t < p.n_frames; ++t) sum += static_cast<double>(p.values[base + t]);
  const auto mean = static_cast<float>(sum / p.n_frames);
  for (int t = 0; t < p.n_frames; ++t) store_mean_out(p, base + t, p.values[base + t] - mean);
}

/// Clip launches, pass 1: thread i = piece * n_cols + col (piece < header->pieces) sums its column over the piece's
/// rows [piece.row, next piece's row or header->rows) in double, frame order, into stats[i].
MELFORGE_HD void fbank_piece_sum_element(const FbankMeanParams& p, int64_t block, int thread, int block_dim) {
  const int64_t i = block * block_dim + thread;
  if (i >= p.total) return;
  const ClipLaunchHeader h = *p.header;
  const int64_t piece = i / p.n_cols;
  if (piece >= h.pieces) return;
  const int col = static_cast<int>(i % p.n_cols);
  const int64_t first = p.pieces[piece].row;
  const int64_t last = piece + 1 < h.pieces ? p.pieces[piece + 1].row : h.rows;
  double sum = 0.0;
  for (int64_t r = first; r < last; ++r) sum += static_cast<double>(p.values[r * p.n_cols + col]);
  p.stats[i] = sum;
}

/// Clip launches, pass 2: element o = row * n_cols + col (row < header->rows) is values[o] minus its clip's column
/// mean, stats[piece of the row][col] (a float held as double).
MELFORGE_HD void fbank_piece_subtract_element(const FbankMeanParams& p, int64_t block, int thread, int block_dim) {
  const int64_t o = block * block_dim + thread;
  if (o >= p.total) return;
  const ClipLaunchHeader h = *p.header;
  const int64_t row = o / p.n_cols;
  if (row >= h.rows || h.pieces < 1) return;
  const int col = static_cast<int>(o % p.n_cols);
  const int64_t piece = find_piece(p.pieces, h.pieces, row);
  store_mean_out(p, o, p.values[o] - static_cast<float>(p.stats[piece * p.n_cols + col]));
}

}  // namespace melforge::mel::cuda
