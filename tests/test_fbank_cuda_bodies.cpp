// The CUDA engine's fbank kernel bodies (mel_cuda_kernels.h, `__host__ __device__`) run on the CPU: every block and
// thread of the launch grids the engine uses, the block sums in the device's tree order, a naive DFT for cuFFT, the
// clip launches as fill_clip_launch fills them (with NaN after each launch's input, so a read outside it shows) and
// the engine's two subtract_mean passes over clip launches. Compared with a naive Kaldi fbank written from
// torchaudio.compliance.kaldi.fbank's steps in double. This is what checks the CUDA fbank math on machines
// without a device; the [cuda] test (test_fbank_cuda.cpp) runs the real kernels. The bodies need the CUDA headers
// (cuda_fp16.h): a build without CUDA has only the framing test.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fbank/fbank_math.h"
#include "fbank_cuda_cases.h"
#include "mel/filterbank.h"
#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#if defined(MELFORGE_HAVE_CUDA)
#include "mel/mel_cuda_kernels.h"
#endif
#include "mel_clips.h"
#include "mel_reference.h"

namespace melforge_test_fbank_cuda_bodies {

using namespace melforge;
using namespace melforge::mel;
using namespace melforge::mel::cuda;
using melforge::test::FbankCase;

#if defined(MELFORGE_HAVE_CUDA)

namespace {

/// A stand-in for the Kaldi bank with the set's num_mel_bins bands over its n_fft (the bodies only read the sparse
/// table): torchaudio's mel bank of the same size, 100 Hz to 6 kHz.
Filterbank test_bank(const MelArgs& a) {
  MelArgs m;
  m.sample_rate = a.sample_rate;
  m.n_fft = a.n_fft;
  m.n_mels = a.fbank.num_mel_bins;
  m.f_min = 100.0f;
  m.f_max = std::min(6000.0f, static_cast<float>(a.sample_rate / 2));
  return build_filterbank(m);
}

/// cos and sin of 2 pi i / n for i < n: the twiddles of a naive DFT of size n.
struct Twiddles {
  std::vector<double> cos_table, sin_table;
  explicit Twiddles(int n) : cos_table(static_cast<size_t>(n)), sin_table(static_cast<size_t>(n)) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < n; ++i) {
      cos_table[static_cast<size_t>(i)] = std::cos(2.0 * pi * i / n);
      sin_table[static_cast<size_t>(i)] = std::sin(2.0 * pi * i / n);
    }
  }
  /// Bin k of the DFT of x[0, n) in double: (re, im).
  template <class T>
  void bin(const T* x, int n, int k, double& re, double& im) const {
    re = 0.0;
    im = 0.0;
    for (int i = 0; i < n; ++i) {
      const auto idx = static_cast<size_t>((static_cast<int64_t>(k) * i) % n);
      re += static_cast<double>(x[i]) * cos_table[idx];
      im -= static_cast<double>(x[i]) * sin_table[idx];
    }
  }
};

/// Naive Kaldi fbank of one clip of `len` samples at `x`, [frames][bins] in double: torchaudio's steps (dither
/// dither_gauss(seed, t, j) * dither, frame mean, raw energy, pre-emphasis with x[-1] = x[0], window, zero padding,
/// energy, |DFT|^2 or |DFT|, the bank, log(max(., FLT_EPSILON)), energy column first or last, per-clip column mean).
/// `frames` frames (clip_frames: a clip too short for one is zero-padded to one frame).
std::vector<double> naive_fbank(const MelArgs& a, const Filterbank& fb, const float* x, int64_t len, int64_t frames) {
  const fbank::FbankArgs& f = a.fbank;
  const int win = f.window_size(a.sample_rate);
  const int n_fft = a.n_fft;
  const int cols = f.bins();
  const std::vector<float> dense = fb.dense();
  std::vector<double> out(static_cast<size_t>(frames * cols));
  const Twiddles dft(n_fft);
  for (int64_t t = 0; t < frames; ++t) {
    std::vector<double> v(static_cast<size_t>(win));
    for (int j = 0; j < win; ++j) {
      const int64_t p = f.frame_start(t, a.sample_rate) + j;
      int64_t i = p;
      if (!f.snip_edges) {
        i = -1;
        if (p >= 0 && p < len) i = p;
        if (p < 0 && -p <= len) i = -p - 1;
        if (p >= len && p < 2 * len) i = 2 * len - 1 - p;
      } else if (p >= len) {
        i = -1;
      }
      double s = i >= 0 ? x[i] : 0.0;
      if (f.dither > 0.0) s += f.dither * fbank::dither_gauss(f.dither_seed, t, j);
      v[static_cast<size_t>(j)] = s;
    }
    double mean = 0.0;
    if (f.remove_dc_offset) {
      for (const double s : v) mean += s / win;
    }
    for (double& s : v) s -= mean;
    double energy = 0.0;
    for (const double s : v) energy += s * s;
    std::vector<double> frame(static_cast<size_t>(n_fft), 0.0);
    for (int j = 0; j < win; ++j) {
      const double prev = v[static_cast<size_t>(std::max(j - 1, 0))];
      const double w = fbank::kaldi_window(static_cast<int>(f.window_type), j, win, f.blackman_coeff);
      frame[static_cast<size_t>(j)] = (v[static_cast<size_t>(j)] - f.preemphasis_coefficient * prev) * w;
    }
    if (!f.raw_energy) {
      energy = 0.0;
      for (const double s : frame) energy += s * s;
    }
    double log_energy = std::log(std::max(energy, static_cast<double>(FLT_EPSILON)));
    if (f.energy_floor > 0.0) log_energy = std::max(log_energy, std::log(f.energy_floor));
    std::vector<double> power(static_cast<size_t>(a.n_freqs()));
    for (int k = 0; k < a.n_freqs(); ++k) {
      double re = 0.0, im = 0.0;
      dft.bin(frame.data(), n_fft, k, re, im);
      const double p2 = re * re + im * im;
      power[static_cast<size_t>(k)] = f.use_power ? p2 : std::sqrt(p2);
    }
    const int shift = f.use_energy && !f.htk_compat ? 1 : 0;
    double* row = out.data() + t * cols;
    for (int m = 0; m < f.num_mel_bins; ++m) {
      double acc = 0.0;
      for (int k = 0; k < a.n_freqs(); ++k) {
        acc += dense[static_cast<size_t>(k) * f.num_mel_bins + m] * power[static_cast<size_t>(k)];
      }
      row[m + shift] = f.use_log_fbank ? std::log(std::max(acc, static_cast<double>(FLT_EPSILON))) : acc;
    }
    if (f.use_energy) row[f.htk_compat ? f.num_mel_bins : 0] = log_energy;
  }
  if (f.subtract_mean) {
    for (int col = 0; col < cols; ++col) {
      double mean = 0.0;
      for (int64_t t = 0; t < frames; ++t) mean += out[static_cast<size_t>(t * cols + col)];
      mean /= static_cast<double>(frames);
      for (int64_t t = 0; t < frames; ++t) out[static_cast<size_t>(t * cols + col)] -= mean;
    }
  }
  return out;
}

/// The fbank gather kernel on the CPU: block `row`, kFbankBlock threads, each phase's per-thread values summed in
/// fbank_block_sum's order (tree_level over a [kFbankBlock] array).
void emulate_gather(const FbankFrameParams& p) {
  std::vector<double> partial(kFbankBlock);
  const auto block_sum = [&](auto per_thread) {
    for (int tid = 0; tid < kFbankBlock; ++tid) partial[static_cast<size_t>(tid)] = per_thread(tid);
    for (int h = kFbankBlock / 2; h > 0; h /= 2) {
      for (int tid = 0; tid < h; ++tid) tree_level(partial.data(), tid, h);
    }
    return partial[0];
  };
  for (int64_t row = 0; row < p.rows; ++row) {
    const FbankFrameSource src = fbank_frame_source(p, row);
    float mean = 0.0f;
    if (p.remove_dc_offset) {
      const double sum = block_sum([&](int tid) { return fbank_partial_sum(p, src, tid, kFbankBlock); });
      mean = static_cast<float>(sum) / static_cast<float>(p.win);
    }
    double energy = 0.0;
    if (p.energy != nullptr && p.raw_energy) {
      energy = block_sum([&](int tid) { return fbank_partial_raw_energy(p, src, mean, tid, kFbankBlock); });
    }
    const double written =
        block_sum([&](int tid) { return fbank_write_frame(p, src, mean, row, tid, kFbankBlock); });
    if (p.energy == nullptr) continue;
    if (!p.raw_energy) energy = written;
    p.energy[row] = src.valid ? fbank_frame_log_energy(p, energy) : 0.0f;
  }
}

/// cuFFT R2C's stand-in: [rows][n_freqs] spectra of [rows][n_fft] frames by a naive DFT in double.
void naive_r2c(const std::vector<float>& frames, int n_fft, int64_t rows, std::vector<float2>& spectrum) {
  const int n_freqs = n_fft / 2 + 1;
  const Twiddles dft(n_fft);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = frames.data() + r * n_fft;
    for (int k = 0; k < n_freqs; ++k) {
      double re = 0.0, im = 0.0;
      dft.bin(x, n_fft, k, re, im);
      spectrum[static_cast<size_t>(r * n_freqs + k)] = float2{static_cast<float>(re), static_cast<float>(im)};
    }
  }
}

/// Runs `body` over the grid of `total` elements in blocks of kMelBlock, as the engine launches it.
template <class Params, class Body>
void over_grid(const Params& p, int64_t total, Body body) {
  for (int64_t b = 0; b < mel_grid(total); ++b) {
    for (int t = 0; t < kMelBlock; ++t) body(p, b, t, kMelBlock);
  }
}

/// Output element `i` of `out` (float32, or half bits decoded).
double out_value(const std::vector<unsigned char>& out, int64_t i, DType dtype) {
  return test::element(out, i, dtype == DType::float16 ? 2 : 4);
}

/// Tolerance against the naive double reference: float32 rounding of the frame, DFT and bank through the log; for
/// float16 its relative rounding and its smallest subnormal (2^-24, what a tiny linear energy underflows to).
double tolerance(double want, double scale, const FbankCase& c, DType dtype) {
  const double rel = dtype == DType::float16 ? 2e-3 : 1e-4;
  const double underflow = dtype == DType::float16 ? 6e-8 : 0.0;
  return rel * std::abs(want) + (c.fbank.use_log_fbank ? 2e-3 : 1e-5 * scale) + underflow;
}

/// The engine's first subtract_mean pass on the host: adds the launch's piece sums stats[pieces][cols] to the sums of
/// their clips (piece i holds clip first_clip + i).
void add_piece_sums(const std::vector<double>& stats, int64_t pieces, int cols, int64_t first_clip,
                    std::vector<double>& clip_sums) {
  for (int64_t i = 0; i < pieces * cols; ++i) {
    clip_sums[static_cast<size_t>(first_clip * cols + i)] += stats[static_cast<size_t>(i)];
  }
}

/// The engine's second pass on the host: stats[i][col] = the float mean of column col of piece i's clip.
void set_piece_means(const std::vector<double>& clip_sums, const ClipBatch& batch, int64_t pieces, int cols,
                     int64_t first_clip, std::vector<double>& stats) {
  for (int64_t i = 0; i < pieces; ++i) {
    const auto n = static_cast<double>(batch.frames(first_clip + i));
    for (int col = 0; col < cols; ++col) {
      const double sum = clip_sums[static_cast<size_t>((first_clip + i) * cols + col)];
      stats[static_cast<size_t>(i * cols + col)] = static_cast<double>(static_cast<float>(sum / n));
    }
  }
}

/// The engine's compute_clips on the CPU through the bodies: fill_clip_launch, gather, DFT, frame-major fbank mel,
/// and for subtract_mean the sum pass (piece sums added per clip) then the subtract pass. Returns [F][bins].
std::vector<unsigned char> emulate_clips(const EngineConfig& config, const Filterbank& fb, const float* samples,
                                         const ClipBatch& batch) {
  const MelArgs& a = config.mel;
  const MelLayout layout = make_layout(config);
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, a.n_fft, config.device_batch, fb.nnz(), &a.fbank);
  const CudaClipSizes clip = cuda_clip_sizes(sizes, a.n_fft, a.hop());
  const bool fp16 = config.dtype == DType::float16;
  const bool mean = a.fbank.subtract_mean;
  const int cols = layout.n_mels;
  std::vector<float> input(static_cast<size_t>(clip.staging_input_floats));
  std::vector<ClipPiece> pieces(static_cast<size_t>(clip.pieces));
  ClipLaunchHeader header;
  std::vector<float> window = fbank_window_table(a);
  std::vector<float> frames(static_cast<size_t>(sizes.frame_floats));
  std::vector<float2> spectrum(static_cast<size_t>(sizes.spectrum_complex));
  std::vector<float> energy(static_cast<size_t>(std::max<int64_t>(sizes.energy_floats, 1)));
  std::vector<float> values(static_cast<size_t>(sizes.output_elems));
  std::vector<unsigned char> launch_out(static_cast<size_t>(sizes.output_bytes()));
  std::vector<double> stats(static_cast<size_t>(std::max<int64_t>(clip.stat_doubles, 1)));
  std::vector<double> clip_sums(static_cast<size_t>(batch.clips() * cols), 0.0);
  const std::vector<int32_t> bands = filterbank_band_table(fb);
  std::vector<unsigned char> out(static_cast<size_t>(batch.out_bytes()));

  FbankFrameParams g = fbank_frame_params(a);
  g.input = input.data();
  g.header = &header;
  g.pieces = pieces.data();
  g.window = window.data();
  g.frames = frames.data();
  g.energy = sizes.energy_floats > 0 ? energy.data() : nullptr;
  g.rows = clip.rows;
  FbankMelParams m = fbank_mel_params(a);
  m.spectrum = spectrum.data();
  m.bands = bands.data();
  m.weights = fb.weights.data();
  m.energy = g.energy;
  m.out = mean ? static_cast<void*>(values.data()) : launch_out.data();
  m.total = clip.rows * cols;
  m.float_out = mean;
  m.fp16 = fp16;
  FbankMeanParams s;
  s.values = values.data();
  s.out = launch_out.data();
  s.header = &header;
  s.pieces = pieces.data();
  s.stats = stats.data();
  s.n_cols = cols;
  s.fp16 = fp16;

  for (const int pass : mean ? std::vector<int>{1, 2} : std::vector<int>{0}) {
    ClipCursor cursor;
    int64_t row = 0;
    while (row < batch.total_frames()) {
      const int64_t first_clip = cursor.clip;
      std::fill(input.begin(), input.end(), std::numeric_limits<float>::quiet_NaN());
      const ClipLaunchFill fill =
          fill_clip_launch(batch, samples, clip, clip_framing(a), cursor, header, pieces.data(), input.data());
      REQUIRE(fill.rows >= 1);
      emulate_gather(g);
      naive_r2c(frames, a.n_fft, clip.rows, spectrum);
      over_grid(m, m.total, fbank_mel_frame_element);
      if (pass == 1) {
        s.total = clip.pieces * cols;
        over_grid(s, s.total, fbank_piece_sum_element);
        add_piece_sums(stats, fill.pieces, cols, first_clip, clip_sums);
      }
      if (pass == 2) {
        set_piece_means(clip_sums, batch, fill.pieces, cols, first_clip, stats);
        s.total = clip.rows * cols;
        over_grid(s, s.total, fbank_piece_subtract_element);
      }
      if (pass != 1) {
        const int64_t bytes = fill.rows * cols * layout.out_elem_bytes;
        std::copy(launch_out.begin(), launch_out.begin() + bytes,
                  out.begin() + row * cols * layout.out_elem_bytes);
      }
      row += fill.rows;
    }
  }
  return out;
}

/// The engine's compute() on the CPU through the bodies: segment gather, DFT, fbank mel, the segment mean kernel.
/// Returns [count][bins][n_frames].
std::vector<unsigned char> emulate_segments(const EngineConfig& config, const Filterbank& fb, const float* base,
                                            const std::vector<int64_t>& offsets) {
  const MelArgs& a = config.mel;
  const MelLayout layout = make_layout(config);
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, a.n_fft, config.device_batch, fb.nnz(), &a.fbank);
  const bool mean = a.fbank.subtract_mean;
  std::vector<float> input(static_cast<size_t>(sizes.input_floats));
  std::vector<float> window = fbank_window_table(a);
  std::vector<float> frames(static_cast<size_t>(sizes.frame_floats));
  std::vector<float2> spectrum(static_cast<size_t>(sizes.spectrum_complex));
  std::vector<float> energy(static_cast<size_t>(std::max<int64_t>(sizes.energy_floats, 1)));
  std::vector<float> values(static_cast<size_t>(sizes.output_elems));
  std::vector<unsigned char> batch_out(static_cast<size_t>(sizes.output_bytes()));
  const std::vector<int32_t> bands = filterbank_band_table(fb);
  std::vector<unsigned char> out(offsets.size() * static_cast<size_t>(layout.out_bytes_per_segment()));

  FbankFrameParams g = fbank_frame_params(a);
  g.input = input.data();
  g.window = window.data();
  g.frames = frames.data();
  g.energy = sizes.energy_floats > 0 ? energy.data() : nullptr;
  g.rows = sizes.frame_rows;
  g.segment_samples = layout.segment_samples;
  g.n_frames = layout.n_frames;
  FbankMelParams m = fbank_mel_params(a);
  m.spectrum = spectrum.data();
  m.bands = bands.data();
  m.weights = fb.weights.data();
  m.energy = g.energy;
  m.out = mean ? static_cast<void*>(values.data()) : batch_out.data();
  m.total = sizes.output_elems;
  m.n_frames = layout.n_frames;
  m.float_out = mean;
  m.fp16 = config.dtype == DType::float16;
  FbankMeanParams s;
  s.values = values.data();
  s.out = batch_out.data();
  s.total = sizes.batch * layout.n_mels;
  s.n_cols = layout.n_mels;
  s.n_frames = layout.n_frames;
  s.fp16 = m.fp16;

  const auto n = static_cast<int64_t>(offsets.size());
  for (int64_t first = 0; first < n; first += sizes.batch) {
    const int64_t count = std::min(sizes.batch, n - first);
    fill_batch_input(input.data(), base, offsets, first, count, layout.segment_samples, sizes);
    emulate_gather(g);
    naive_r2c(frames, a.n_fft, sizes.frame_rows, spectrum);
    over_grid(m, m.total, fbank_mel_element);
    if (mean) over_grid(s, s.total, fbank_segment_mean_element);
    const int64_t bytes = count * layout.out_bytes_per_segment();
    std::copy(batch_out.begin(), batch_out.begin() + bytes, out.begin() + first * layout.out_bytes_per_segment());
  }
  return out;
}

/// The sets of the [cuda] test at shorter lengths (the naive DFT is slow): segments of 0.1 s, device batch 2.
FbankCase small(FbankCase c) {
  c.segment_samples = c.sample_rate / 10;
  c.device_batch = 2;
  return c;
}

/// Checks `got` against `want` (engine outputs of `dtype`) with the [cuda] test's tolerance; `what` names a failure.
void require_engine_close(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                          const FbankCase& c, DType dtype, const std::string& what) {
  REQUIRE(got.size() == want.size());
  const auto n = static_cast<int64_t>(want.size()) / (dtype == DType::float16 ? 2 : 4);
  double scale = 0.0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(out_value(want, i, dtype)));
  const double rel = dtype == DType::float16 ? 2e-3 : 2e-4;
  for (int64_t i = 0; i < n; ++i) {
    const double g = out_value(got, i, dtype);
    const double w = out_value(want, i, dtype);
    if (!(std::abs(g - w) <= rel * std::abs(w) + (c.fbank.use_log_fbank ? 5e-3 : 1e-5 * scale))) {
      FAIL(what << " element " << i << ": bodies " << g << ", cpu engine " << w);
    }
  }
}


}  // namespace

TEST_CASE("CUDA fbank kernel bodies on the CPU match a naive Kaldi fbank, clips and segments", "[fbank][cuda_host]") {
  const FbankCase c = small(GENERATE(from_range(test::fbank_cases())));
  const DType dtype = GENERATE(DType::float16, DType::float32);
  INFO(c.name << ", " << to_string(dtype));
  const EngineConfig config = c.config(dtype);
  const MelArgs& a = config.mel;
  const Filterbank fb = test_bank(a);
  const int cols = c.fbank.bins();

  const std::vector<int64_t> lengths = {0, 1, 150, 399, 401, 0, 2300, 7, 160, 1203};
  const std::vector<int64_t> offsets = test::clip_offsets(lengths, 3);
  const std::vector<float> signal = test::clip_signal(offsets.back() + 5, 41);
  const ClipBatch batch = plan_clips(a, dtype, offsets);
  const std::vector<unsigned char> got = emulate_clips(config, fb, signal.data(), batch);
  std::vector<std::vector<double>> wants;
  double scale = 0.0;
  for (int64_t k = 0; k < batch.clips(); ++k) {
    wants.push_back(
        naive_fbank(a, fb, signal.data() + offsets[static_cast<size_t>(k)], batch.samples(k), batch.frames(k)));
    for (const double v : wants.back()) scale = std::max(scale, std::abs(v));
  }
  for (int64_t k = 0; k < batch.clips(); ++k) {
    const std::vector<double>& want = wants[static_cast<size_t>(k)];
    for (int64_t i = 0; i < batch.frames(k) * cols; ++i) {
      const double g = out_value(got, batch.frame_offsets[static_cast<size_t>(k)] * cols + i, dtype);
      const double w = want[static_cast<size_t>(i)];
      if (!(std::abs(g - w) <= tolerance(w, scale, c, dtype))) {
        FAIL("clip " << k << " (" << batch.samples(k) << " samples) frame " << i / cols << " column " << i % cols
                     << ": bodies " << g << ", naive " << w);
      }
    }
  }

  const std::vector<int64_t> segments = {0, 517, c.segment_samples, 33, offsets.back() - c.segment_samples};
  const std::vector<unsigned char> seg = emulate_segments(config, fb, signal.data(), segments);
  const int n_frames = a.n_frames(c.segment_samples);
  for (size_t k = 0; k < segments.size(); ++k) {
    const std::vector<double> want = naive_fbank(a, fb, signal.data() + segments[k], c.segment_samples, n_frames);
    for (int col = 0; col < cols; ++col) {
      for (int t = 0; t < n_frames; ++t) {
        const double g = out_value(seg, (static_cast<int64_t>(k) * cols + col) * n_frames + t, dtype);
        const double w = want[static_cast<size_t>(t) * cols + col];
        if (!(std::abs(g - w) <= tolerance(w, scale, c, dtype))) {
          FAIL("segment " << k << " frame " << t << " column " << col << ": bodies " << g << ", naive " << w);
        }
      }
    }
  }
}

TEST_CASE("CUDA fbank kernel bodies on the CPU match the CPU engine, clips and segments", "[fbank][cuda_host]") {
  const FbankCase c = small(GENERATE(from_range(test::fbank_cases())));
  const DType dtype = GENERATE(DType::float16, DType::float32);
  INFO(c.name << ", " << to_string(dtype));
  const EngineConfig config = c.config(dtype);
  const MelArgs& a = config.mel;
  const Filterbank& fb = *cached_filterbank(a);
  const std::vector<int64_t> offsets = test::clip_offsets({0, 1, 150, 399, 401, 0, 2300, 7, 160, 1203}, 3);
  const std::vector<float> signal = test::clip_signal(offsets.back() + 5, 43);
  const ClipBatch batch = plan_clips(a, dtype, offsets);
  auto cpu = make_cpu_engine(config);
  std::vector<unsigned char> want(static_cast<size_t>(batch.out_bytes()));
  cpu->compute_clips(signal.data(), batch, want.data());
  require_engine_close(emulate_clips(config, fb, signal.data(), batch), want, c, dtype, "compute_clips");
  const std::vector<int64_t> segments = {0, 517, c.segment_samples, 33, offsets.back() - c.segment_samples};
  std::vector<unsigned char> seg(segments.size() * static_cast<size_t>(cpu->layout().out_bytes_per_segment()));
  cpu->compute(signal.data(), segments, seg.data());
  require_engine_close(emulate_segments(config, fb, signal.data(), segments), seg, c, dtype, "compute");
}

#endif

TEST_CASE("fbank clip framing: every sample a clip launch's frames read lies in the piece's uploaded range",
          "[fbank][cuda_host]") {
  const int sample_rate = GENERATE(8000, 16000, 22050);
  const bool snip = GENERATE(false, true);
  const double frame_length = GENERATE(25.0, 20.0, 31.3);
  fbank::FbankArgs f;
  f.snip_edges = snip;
  f.frame_length = frame_length;
  MelArgs a;
  a.sample_rate = sample_rate;
  a.use_fbank(f);
  const ClipFraming framing = clip_framing(a);
  INFO(sample_rate << " Hz, snip_edges " << snip << ", frame_length " << frame_length);
  CHECK(framing.n_fft == f.window_size(sample_rate));
  CHECK(framing.hop == f.window_shift(sample_rate));
  CHECK(framing.pad == -f.frame_start(0, sample_rate));
  for (int64_t len = 0; len < 3 * framing.n_fft; len += 7) {
    const int64_t frames = a.clip_frames(len);
    for (int64_t first = 0; first < frames; ++first) {
      for (const int64_t count : {int64_t{1}, frames - first}) {
        int64_t lo = 0, hi = 0;
        piece_sample_range(first, count, len, framing, lo, hi);
        for (int64_t t = first; t < first + count; ++t) {
          for (int j = 0; j < framing.n_fft; ++j) {
            const int64_t p = f.frame_start(t, sample_rate) + j;
            const int64_t i = snip ? (p < len ? p : -1) : fbank::kaldi_mirror_index(p, len);
            if (i >= 0 && (i < lo || i >= hi)) {
              FAIL("clip of " << len << " samples, frames " << first << "+" << count << ": frame " << t
                              << " reads sample " << i << " outside [" << lo << ", " << hi << ")");
            }
          }
        }
      }
    }
  }
}

}  // namespace melforge_test_fbank_cuda_bodies
