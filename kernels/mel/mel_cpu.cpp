// The CPU log-mel engine. Each segment is cut into blocks of frames; a block is framed and windowed into a per-thread
// buffer, transformed by one batched FFTW r2c call (plans made once, executed with the new-array functions), then
// turned into power (transposed to bin-major, [n_freqs][block]), sparse mel, log and the output type,
// written as [n_mels][n_frames] columns of the segment. Frames that reach into the padding are windowed from a
// per-thread copy of the padded samples they cover, so that every frame is windowed by the same vector loop.
// Work items are (segment, block) pairs, split in contiguous ranges over the threads, each with its own scratch.
// compute_clips cuts the batch's concatenated frames (clip after clip) into blocks of the same size instead: a block
// holds the frames of one or more clips, each framed with its own length and edges, and its mel rows are stored
// frame-major ([F][n_mels]); the last block is padded with zero frames so that one plan serves every block.
// With fbank args (Kaldi's filterbank, docs/FBANK.md) each frame is framed and preprocessed by fbank::FramePrep
// (Kaldi's edges, dither, DC removal, pre-emphasis, window, zero padding) into the same FFT batch, its log energy
// into its own row of the mel scratch (the energy column); the power, filterbank (the Kaldi bank), log and store
// stages are shared.
//
// Plans use FFTW_ESTIMATE: the algorithm FFTW picks does not depend on timings, so a configuration gives bitwise the
// same spectrograms in every run and process (FFTW_MEASURE may pick another algorithm, and rounding, per run), and
// on this library's sizes MEASURE was not measurably faster.
//
// The per-element math is mel_math.h's, except the logarithm: log_compress's formula is evaluated with a
// branch-free logarithm (log_positive) so that the log loop vectorises; it agrees with log_compress to 3 float32 ulps
// and exactly at the floor, so silence gives exactly silence_value().
#include "mel/mel_cpu.h"

#include <fftw3.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <limits>
#include <mutex>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/fftw_lock.h"
#include "melforge/common/parallel.h"
#include "melforge/common/timing.h"
#include "fbank/fbank_frames.h"
#include "fbank/fbank_math.h"
#include "mel/filterbank.h"
#include "mel/half.h"
#include "mel/mel_math.h"

// The element-wise loops are compiled twice, for AVX2 and for the baseline, and the loader picks one for the CPU.
// Both use the same IEEE operations in the same order, so they give bitwise the same results. No clone may target an
// ISA with FMA (avx512f, x86-64-v3/v4, fma): GCC contracts a * b + c into an FMA in C++ mode by default
// (-ffp-contract=fast), which rounds once instead of twice and would make the spectrograms depend on the CPU.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MELFORGE_NO_CLONES)
#define MELFORGE_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#define MELFORGE_AVX2_TILES 1
#include <immintrin.h>
#else
#define MELFORGE_SIMD_CLONES
#define MELFORGE_AVX2_TILES 0
#endif

namespace melforge::mel {
namespace {

/// An fftwf_malloc'ed array (SIMD-aligned, as the new-array execute functions require).
template <class T>
struct FftwBuffer {
  /// The array.
  T* data = nullptr;
  /// Allocates `count` elements (uninitialised).
  explicit FftwBuffer(std::size_t count)
      : data(static_cast<T*>(fftwf_malloc(sizeof(T) * std::max<std::size_t>(count, 1)))) {
    if (data == nullptr) throw Error("fftwf_malloc of " + std::to_string(sizeof(T) * count) + " bytes failed");
  }
  ~FftwBuffer() { fftwf_free(data); }
  FftwBuffer(FftwBuffer&& o) noexcept : data(o.data) { o.data = nullptr; }
  FftwBuffer(const FftwBuffer&) = delete;
  FftwBuffer& operator=(const FftwBuffer&) = delete;
  FftwBuffer& operator=(FftwBuffer&&) = delete;
};

/// One thread's working memory, reused for every block.
struct Scratch {
  /// [(block - 1) * hop + n_fft] padded samples under a block's edge frames (indexed from the block's first sample).
  std::vector<float> padded;
  /// [block][n_fft] windowed frames.
  FftwBuffer<float> frames;
  /// [block][n_freqs] spectra.
  FftwBuffer<fftwf_complex> spectrum;
  /// [n_freqs][block] |X|^power, frames contiguous.
  FftwBuffer<float> power;
  /// [n_mels][block] mel energies (fbank: with the energy column's row).
  FftwBuffer<float> mel;
  /// fbank: [window] a frame gathered from mirrored or zero-padded edges.
  std::vector<float> gather;
  /// fbank: [window] a frame after dither.
  std::vector<float> prep;
  /// fbank with subtract_mean: [n_mels][n_frames] one segment's float output (compute()).
  std::vector<float> segment;
  explicit Scratch(const CpuScratchSizes& s)
      : padded(static_cast<std::size_t>(s.padded_floats)),
        frames(static_cast<std::size_t>(s.frame_floats)),
        spectrum(static_cast<std::size_t>(s.spectrum_complex)),
        power(static_cast<std::size_t>(s.power_floats)),
        mel(static_cast<std::size_t>(s.mel_floats)),
        gather(static_cast<std::size_t>(s.gather_floats)),
        prep(static_cast<std::size_t>(s.prep_floats)),
        segment(static_cast<std::size_t>(s.segment_floats)) {}
};

/// A batched r2c plan over `howmany` contiguous frames; destroyed under the planner lock.
class R2cPlan {
 public:
  R2cPlan() = default;
  R2cPlan(int n_fft, int howmany, float* in, fftwf_complex* out) {
    const int n_freqs = n_fft / 2 + 1;
    std::lock_guard lock(fftw_planner_mutex());
    plan_ = fftwf_plan_many_dft_r2c(1, &n_fft, howmany, in, nullptr, 1, n_fft, out, nullptr, 1, n_freqs,
                                    FFTW_ESTIMATE);
    if (plan_ == nullptr) {
      throw Error("FFTW could not plan " + std::to_string(howmany) + " real FFTs of size " + std::to_string(n_fft));
    }
  }
  ~R2cPlan() {
    if (plan_ == nullptr) return;
    std::lock_guard lock(fftw_planner_mutex());
    fftwf_destroy_plan(plan_);
  }
  R2cPlan(const R2cPlan&) = delete;
  R2cPlan& operator=(const R2cPlan&) = delete;
  R2cPlan& operator=(R2cPlan&& o) noexcept {
    std::swap(plan_, o.plan_);
    return *this;
  }
  /// Transforms `in` into `out`: arrays laid out and aligned as the planning ones. Thread-safe.
  void execute(float* in, fftwf_complex* out) const { fftwf_execute_dft_r2c(plan_, in, out); }

 private:
  fftwf_plan plan_ = nullptr;
};

/// All ones when `b`, else zero.
inline uint32_t mask(bool b) { return static_cast<uint32_t>(-static_cast<int32_t>(b)); }
/// `a` where `m` is all ones, `b` where it is zero. Written with bit operations rather than `?:` so that GCC, which
/// will not if-convert a trapping float operation feeding a conditional, vectorises the loops using it.
inline float blend(uint32_t m, float a, float b) {
  return std::bit_cast<float>((m & std::bit_cast<uint32_t>(a)) | (~m & std::bit_cast<uint32_t>(b)));
}

/// Natural logarithm of a finite x > 0 (subnormals included), without branches: x = 2^e * m with m in
/// [sqrt(1/2), sqrt(2)), f = m - 1 (exact), s = f/(2+f), and log(m) = 2 atanh(s) = f - (f^2/2 - s*(f^2/2 + R)) with
/// R = 2s^2/3 + 2s^4/5 + 2s^6/7 + 2s^8/9 (|s| <= 0.172: truncation below 1e-9 relative), plus e*ln2 in two parts.
/// Within about 1 ulp of logf. Other inputs give unspecified values.
inline float log_positive(float x) {
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.42860682030941723212e-06f;
  constexpr uint32_t kSqrtHalfBits = 0x3f3504f3u;
  const uint32_t tiny = mask(x < FLT_MIN);
  const float normalised = blend(tiny, x * 8388608.0f, x);
  const uint32_t u = std::bit_cast<uint32_t>(normalised) + (0x3f800000u - kSqrtHalfBits);
  const int32_t e = static_cast<int32_t>(u >> 23) - 127 - static_cast<int32_t>(tiny & 23u);
  const float f = std::bit_cast<float>((u & 0x007fffffu) + kSqrtHalfBits) - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float r = z * (2.0f / 3.0f + z * (2.0f / 5.0f + z * (2.0f / 7.0f + z * (2.0f / 9.0f))));
  const float half_f2 = 0.5f * f * f;
  const float correction = s * (half_f2 + r) - half_f2;
  const auto ef = static_cast<float>(e);
  return ef * kLn2Hi + ((ef * kLn2Lo + correction) + f);
}

/// log_compress for one LogMode and power, with its constants computed once.
struct LogStage {
  /// static_cast<int>(LogMode).
  int mode = 0;
  /// db: (20/power)/ln(10); ln: 1.
  float scale = 1.0f;
  /// db: amin; ln: 0. Values at or below it give `floor`.
  float threshold = 0.0f;
  /// ln: log_eps, added before the log.
  float offset = 0.0f;
  /// log_compress(0): the value of silence.
  float floor = 0.0f;

  /// mel: log_compress for a.log; fbank: kaldi_log (log(max(x, FLT_EPSILON)): threshold FLT_EPSILON, offset 0,
  /// floor log(FLT_EPSILON)) with use_log_fbank, else none.
  explicit LogStage(const MelArgs& a)
      : mode(static_cast<int>(a.log)),
        scale(a.log == LogMode::db ? static_cast<float>(20.0 / a.power / std::log(10.0)) : 1.0f),
        threshold(a.log == LogMode::db ? a.amin : 0.0f),
        offset(a.log == LogMode::ln ? a.log_eps : 0.0f),
        floor(log_compress(0.0f, static_cast<int>(a.log), a.power, a.amin, a.log_eps)) {
    if (!a.is_fbank()) return;
    mode = static_cast<int>(a.fbank.use_log_fbank ? LogMode::ln : LogMode::none);
    scale = 1.0f;
    threshold = FLT_EPSILON;
    offset = 0.0f;
    floor = a.fbank.use_log_fbank ? fbank::kaldi_log(0.0f) : 0.0f;
  }

  /// Replaces the `n` energies at `v` by their logs.
  void apply(float* v, int64_t n) const;
};

/// log_compress of `n` values in place; see cpu_log_compress.
MELFORGE_SIMD_CLONES void log_row(const LogStage& stage, float* v, int64_t n) {
  const float scale = stage.scale, threshold = stage.threshold, offset = stage.offset, floor = stage.floor;
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    const float y = scale * log_positive(x + offset);
    const float logged = blend(mask(x > threshold), y, floor);
    v[i] = blend(mask(x < std::numeric_limits<float>::infinity()), logged, x);
  }
}

void LogStage::apply(float* v, int64_t n) const {
  if (mode != static_cast<int>(LogMode::none)) log_row(*this, v, n);
}

/// dst[j] = src[j] * w[j] for j < n.
MELFORGE_SIMD_CLONES void window_copy(const float* __restrict src, const float* __restrict w, float* __restrict dst,
                                      int n) {
  for (int j = 0; j < n; ++j) dst[j] = src[j] * w[j];
}

/// dst[f] = |bin[f * stride]|^power for f < n: one bin of n spectra `stride` complex values apart.
MELFORGE_SIMD_CLONES void power_row(const float* __restrict bin, int stride, float power, float* __restrict dst,
                                    int n) {
  const std::size_t step = 2 * static_cast<std::size_t>(stride);
  if (power == 2.0f) {
    for (int f = 0; f < n; ++f) dst[f] = spectral_power(bin[f * step], bin[f * step + 1], 2.0f);
  } else if (power == 1.0f) {
    for (int f = 0; f < n; ++f) dst[f] = spectral_power(bin[f * step], bin[f * step + 1], 1.0f);
  } else {
    for (int f = 0; f < n; ++f) dst[f] = spectral_power(bin[f * step], bin[f * step + 1], power);
  }
}

#if MELFORGE_AVX2_TILES
/// |X|^2 of an 8 x 8 tile, transposed: pt[i * stride + j] = |X_j[i]|^2 for frames j and bins i in [0, 8), where
/// X_j[i] is the (re, im) pair at spec + 2 * (j * n_freqs + i). Each power is re * re + im * im rounded as
/// spectral_power rounds it (two products, one sum, no FMA), so the tile equals power_row's values bit for bit. Loads
/// 8 bins of each frame, squares them as one vector (bins in the order 0 1 4 5 2 3 6 7 that the de-interleave
/// leaves) and transposes the 8 x 8 block in registers.
__attribute__((target("avx2"))) void power_tile(const float* spec, int n_freqs, float* pt, std::size_t stride) {
  __m256 p[8];
  for (int j = 0; j < 8; ++j) {
    const float* src = spec + 2 * static_cast<std::size_t>(j) * n_freqs;
    const __m256 a = _mm256_loadu_ps(src);
    const __m256 b = _mm256_loadu_ps(src + 8);
    const __m256 re = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 im = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    p[j] = _mm256_add_ps(_mm256_mul_ps(re, re), _mm256_mul_ps(im, im));
  }
  const __m256 t0 = _mm256_unpacklo_ps(p[0], p[1]), t1 = _mm256_unpackhi_ps(p[0], p[1]);
  const __m256 t2 = _mm256_unpacklo_ps(p[2], p[3]), t3 = _mm256_unpackhi_ps(p[2], p[3]);
  const __m256 t4 = _mm256_unpacklo_ps(p[4], p[5]), t5 = _mm256_unpackhi_ps(p[4], p[5]);
  const __m256 t6 = _mm256_unpacklo_ps(p[6], p[7]), t7 = _mm256_unpackhi_ps(p[6], p[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 column[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                            _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                            _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                            _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
  constexpr int kBin[8] = {0, 1, 4, 5, 2, 3, 6, 7};
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(pt + static_cast<std::size_t>(kBin[c]) * stride, column[c]);
}

/// Whether this CPU runs power_tile.
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

/// mel[m * stride + f] = sum over the bins k of band m, in increasing order, of w(m, k) * power[k * stride + f], for
/// every band m and frame f < n: the sparse filterbank applied to `n` power columns at once. One call per block, so
/// that the dispatch to the SIMD clone and the loop set-up are paid once rather than once per (band, bin).
MELFORGE_SIMD_CLONES void apply_filterbank(const Filterbank& fb, const float* __restrict power, std::size_t stride,
                                           int n, float* __restrict mel) {
  for (int m = 0; m < fb.n_mels; ++m) {
    float* acc = mel + static_cast<std::size_t>(m) * stride;
    for (int f = 0; f < n; ++f) acc[f] = 0.0f;
    const float* wts = fb.weights.data() + fb.offset[m];
    for (int k = fb.begin[m]; k < fb.end[m]; ++k) {
      const float w = wts[k - fb.begin[m]];
      const float* row = power + static_cast<std::size_t>(k) * stride;
      for (int f = 0; f < n; ++f) acc[f] += w * row[f];
    }
  }
}

/// Stores the `count` values of one mel row as float or as half bits.
void store_row(const float* values, int count, float* out) { std::copy(values, values + count, out); }
MELFORGE_SIMD_CLONES void store_row(const float* __restrict values, int count, uint16_t* __restrict out) {
  for (int i = 0; i < count; ++i) out[i] = float_to_half_bits(values[i]);
}

/// Stores `count` frames of mel rows [n_mels][stride] frame-major: out[f * n_mels + m] = mel[m * stride + f], as
/// float or as half bits.
void store_frames(const float* mel, int stride, int count, int n_mels, float* out) {
  for (int f = 0; f < count; ++f) {
    for (int m = 0; m < n_mels; ++m) {
      out[static_cast<std::size_t>(f) * n_mels + m] = mel[static_cast<std::size_t>(m) * stride + f];
    }
  }
}
void store_frames(const float* mel, int stride, int count, int n_mels, uint16_t* out) {
  for (int f = 0; f < count; ++f) {
    for (int m = 0; m < n_mels; ++m) {
      out[static_cast<std::size_t>(f) * n_mels + m] = float_to_half_bits(mel[static_cast<std::size_t>(m) * stride + f]);
    }
  }
}

/// Subtracts from each of `cols` columns its mean over `rows` rows, in place: value (i, k) at data[i * row_step + k *
/// col_step]. The mean is the double sum rounded to float over float(rows), as torch.mean (sum, then divide).
void subtract_means(float* data, int64_t rows, int cols, int64_t row_step, int64_t col_step) {
  if (rows <= 0) return;
  for (int k = 0; k < cols; ++k) {
    float* col = data + k * col_step;
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) total += static_cast<double>(col[i * row_step]);
    const float mean = static_cast<float>(total) / static_cast<float>(rows);
    for (int64_t i = 0; i < rows; ++i) col[i * row_step] -= mean;
  }
}

/// `config` after checking its mel parameters for its segment length.
const EngineConfig& validated(const EngineConfig& config) {
  config.mel.validate(config.segment_samples);
  return config;
}

/// The CPU engine. compute() calls on one engine are serialised (they share the per-thread scratch).
class CpuMelEngine final : public MelEngine {
 public:
  explicit CpuMelEngine(const EngineConfig& config)
      : config_(validated(config)),
        layout_(make_layout(config_)),
        fb_(cached_filterbank(config_.mel)),
        log_(config_.mel) {
    const MelArgs& mel = config_.mel;
    n_fft_ = mel.n_fft;
    hop_ = mel.hop();
    pad_ = mel.pad();
    reflect_ = mel.center && mel.pad_mode == PadMode::reflect;
    block_ = cpu_block_frames(layout_.n_frames, n_fft_);
    blocks_per_segment_ = (layout_.n_frames + block_ - 1) / block_;
    threads_ = resolve_threads(config_.threads);
    power_ = mel.power;
    mel_rows_ = layout_.n_mels;
    if (mel.is_fbank()) {
      prep_ = std::make_unique<fbank::FramePrep>(mel.fbank, mel.sample_rate);
      power_ = mel.fbank.use_power ? 2.0f : 1.0f;
      mel_rows_ = mel.fbank.num_mel_bins;
      subtract_mean_ = mel.fbank.subtract_mean;
      if (mel.fbank.use_energy) {
        energy_row_ = mel.fbank.htk_compat ? mel_rows_ : 0;
        mel_row0_ = mel.fbank.htk_compat ? 0 : 1;
      }
    } else {
      window_.assign(static_cast<std::size_t>(n_fft_), 0.0f);
      const int win = mel.win();
      const int left = (n_fft_ - win) / 2;
      for (int j = 0; j < win; ++j) {
        const float w = mel.window == Window::hann ? hann(j, win) : hamming(j, win);
        window_[static_cast<std::size_t>(left + j)] = w;
      }
    }

    scratch_.reserve(static_cast<std::size_t>(threads_));
    const CpuScratchSizes sizes = cpu_scratch_sizes(config_);
    for (int t = 0; t < threads_; ++t) scratch_.emplace_back(sizes);
    host_bytes_ = cpu_engine_host_bytes(config_);
    Scratch& s = scratch_.front();
    plan_block_ = R2cPlan(n_fft_, block_, s.frames.data, s.spectrum.data);
    const int tail = layout_.n_frames % block_;
    if (tail != 0) plan_tail_ = R2cPlan(n_fft_, tail, s.frames.data, s.spectrum.data);
  }

  void compute(const float* base, std::span<const int64_t> offsets, void* out) override {
    if (offsets.empty()) return;
    if (base == nullptr || out == nullptr) throw InvalidArgument("cpu mel engine: null input or output buffer");
    std::lock_guard lock(compute_mutex_);
    Stopwatch watch;
    const auto segments = static_cast<int64_t>(offsets.size());
    if (subtract_mean_) {
      parallel_ranges(segments, threads_, [&](int thread, int64_t begin, int64_t end) {
        Scratch& s = scratch_[static_cast<std::size_t>(thread)];
        for (int64_t segment = begin; segment < end; ++segment) {
          run_whole_segment(base + offsets[static_cast<std::size_t>(segment)], s, out, segment);
        }
      });
      compute_s_.fetch_add(watch.seconds());
      return;
    }
    const int64_t items = segments * blocks_per_segment_;
    parallel_ranges(items, threads_, [&](int thread, int64_t begin, int64_t end) {
      Scratch& s = scratch_[static_cast<std::size_t>(thread)];
      for (int64_t item = begin; item < end; ++item) {
        const int64_t segment = item / blocks_per_segment_;
        const int block = static_cast<int>(item % blocks_per_segment_);
        const float* x = base + offsets[static_cast<std::size_t>(segment)];
        if (config_.dtype == DType::float16) {
          auto* o = static_cast<uint16_t*>(out) + segment * layout_.out_elems_per_segment();
          run_block(x, block, s, o);
        } else {
          auto* o = static_cast<float*>(out) + segment * layout_.out_elems_per_segment();
          run_block(x, block, s, o);
        }
      }
    });
    compute_s_.fetch_add(watch.seconds());
  }

  void compute_clips(const float* samples, const ClipBatch& batch, void* out) override {
    check_clip_batch(batch, config_.mel, config_.dtype);
    if (batch.clips() == 0) return;
    if (out == nullptr) throw InvalidArgument("cpu mel engine: null output buffer");
    if (samples == nullptr && batch.sample_offsets.back() > batch.sample_offsets.front()) {
      throw InvalidArgument("cpu mel engine: null input buffer");
    }
    std::lock_guard lock(compute_mutex_);
    Stopwatch watch;
    const int64_t blocks = (batch.total_frames() + block_ - 1) / block_;
    const bool half = config_.dtype == DType::float16;
    std::vector<float> rows;
    if (subtract_mean_ && half) rows.resize(static_cast<std::size_t>(batch.out_elems()));
    float* float_out = subtract_mean_ && half ? rows.data() : static_cast<float*>(out);
    parallel_ranges(blocks, threads_, [&](int thread, int64_t begin, int64_t end) {
      Scratch& s = scratch_[static_cast<std::size_t>(thread)];
      for (int64_t block = begin; block < end; ++block) {
        if (half && !subtract_mean_) {
          run_clip_block(samples, batch, block, s, static_cast<uint16_t*>(out));
        } else {
          run_clip_block(samples, batch, block, s, float_out);
        }
      }
    });
    if (subtract_mean_) subtract_clip_means(batch, float_out, half ? static_cast<uint16_t*>(out) : nullptr);
    compute_s_.fetch_add(watch.seconds());
  }

  std::string name() const override { return "cpu-fftw"; }
  EngineTimes times() const override {
    EngineTimes t;
    t.compute_s = compute_s_.load();
    return t;
  }
  int64_t device_bytes() const override { return 0; }
  int64_t host_bytes() const override { return host_bytes_; }
  const MelLayout& layout() const override { return layout_; }

 private:
  /// Frames `count` frames starting at frame `t0` of the `len` samples at `x` (a segment or a clip; edges reflected
  /// when `reflect`, else zeros) into dst[count][n_fft]. Frames inside [0, len) read `x`; frames that reach into the
  /// padding read s.padded, filled with padded_sample's values over just their samples.
  void frame_block(const float* x, int64_t len, bool reflect, int64_t t0, int count, float* dst, Scratch& s) const {
    const int64_t first = t0 * hop_ - pad_;
    const auto start = [&](int f) { return first + static_cast<int64_t>(f) * hop_; };
    const auto inside = [&](int f) { return start(f) >= 0 && start(f) + n_fft_ <= len; };
    int head = 0;
    while (head < count && !inside(head)) ++head;
    int tail = count;
    while (tail > head && !inside(tail - 1)) --tail;
    if (head > 0) fill_padded(x, len, reflect, first, start(0), start(head - 1) + n_fft_, s);
    if (tail < count) fill_padded(x, len, reflect, first, start(tail), start(count - 1) + n_fft_, s);
    for (int f = 0; f < count; ++f) {
      const float* src = inside(f) ? x + start(f) : s.padded.data() + (start(f) - first);
      window_copy(src, window_.data(), dst + static_cast<std::size_t>(f) * n_fft_, n_fft_);
    }
  }

  /// Writes the padded sample at each position p in [p0, p1) of the `len` samples at `x` (padded_sample's value: x[p]
  /// inside [0, len), the reflection (`reflect`) or zero outside) to s.padded[p - first], where `first` is the block's
  /// first sample position.
  void fill_padded(const float* x, int64_t len, bool reflect, int64_t first, int64_t p0, int64_t p1,
                   Scratch& s) const {
    const int64_t lo = std::clamp<int64_t>(p0, 0, len);
    const int64_t hi = std::clamp<int64_t>(p1, lo, len);
    float* d = s.padded.data();
    for (int64_t p = p0; p < std::min(lo, p1); ++p) d[p - first] = padded_sample(x, len, p + pad_, pad_, reflect);
    std::copy(x + lo, x + hi, d + (lo - first));
    for (int64_t p = std::max(hi, p0); p < p1; ++p) d[p - first] = padded_sample(x, len, p + pad_, pad_, reflect);
  }

  /// fbank: frames t0 .. t0 + count - 1 of the `len` samples at `x` (a clip or a segment), each through
  /// FramePrep (framing with Kaldi's edges, dither, DC removal, pre-emphasis, window, zero padding) into rows
  /// [row, row + count) of s.frames; their log energies into the energy row of s.mel (use_energy).
  void fbank_frame_block(const float* x, int64_t len, int64_t t0, int count, int row, Scratch& s) const {
    for (int f = 0; f < count; ++f) {
      const int64_t t = t0 + f;
      const float* src = prep_->source(x, len, t, s.gather.data());
      float* dst = s.frames.data + static_cast<std::size_t>(row + f) * n_fft_;
      const float energy = prep_->prepare(src, t, s.prep.data(), dst);
      if (energy_row_ >= 0) s.mel.data[static_cast<std::size_t>(energy_row_) * block_ + row + f] = energy;
    }
  }

  /// Mel energies of the `count` spectra in s.spectrum into rows [mel_row0_, mel_row0_ + mel_rows_) of s.mel
  /// ([n_mels][block]): |X|^power transposed to [n_freqs][block], then for each band the weighted sum of its bins,
  /// accumulated over all frames at once (the loop over frames is contiguous and vectorises). Each energy is the sum
  /// over its bins in increasing order, as in the filterbank.
  void mel_block(int count, Scratch& s) const {
    cpu_power_transposed(s.spectrum.data[0], count, layout_.n_freqs, power_, s.power.data, block_);
    apply_filterbank(*fb_, s.power.data, static_cast<std::size_t>(block_), count, mel_rows(s));
  }

  /// First mel row of s.mel (after the energy row of fbank's use_energy without htk_compat).
  float* mel_rows(Scratch& s) const { return s.mel.data + static_cast<std::size_t>(mel_row0_) * block_; }

  /// Replaces the mel energies of the first `count` frames of s.mel's mel rows by their logs.
  void log_block(int count, Scratch& s) const {
    if (count == block_) {
      log_.apply(mel_rows(s), static_cast<int64_t>(mel_rows_) * count);
      return;
    }
    for (int m = 0; m < mel_rows_; ++m) log_.apply(mel_rows(s) + static_cast<std::size_t>(m) * block_, count);
  }

  /// compute() with fbank subtract_mean: every block of segment `segment` (samples at `x`) into s.segment (float,
  /// [n_mels][n_frames]), each row minus its mean over the frames, then stored as the configured dtype into its slot
  /// of `out`.
  void run_whole_segment(const float* x, Scratch& s, void* out, int64_t segment) const {
    for (int block = 0; block < blocks_per_segment_; ++block) run_block(x, block, s, s.segment.data());
    subtract_means(s.segment.data(), layout_.n_frames, layout_.n_mels, 1, layout_.n_frames);
    const int64_t elems = layout_.out_elems_per_segment();
    if (config_.dtype == DType::float16) {
      store_row(s.segment.data(), static_cast<int>(elems), static_cast<uint16_t*>(out) + segment * elems);
    } else {
      store_row(s.segment.data(), static_cast<int>(elems), static_cast<float*>(out) + segment * elems);
    }
  }

  /// compute_clips with fbank subtract_mean: subtracts each clip's column means from `rows` ([F][n_mels] float), in
  /// parallel over clips, then (half != nullptr) converts them to half bits into `half`.
  void subtract_clip_means(const ClipBatch& batch, float* rows, uint16_t* half) const {
    const int cols = layout_.n_mels;
    parallel_ranges(batch.clips(), threads_, [&](int, int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        float* clip = rows + batch.frame_offsets[static_cast<std::size_t>(c)] * cols;
        subtract_means(clip, batch.frames(c), cols, cols, 1);
        if (half != nullptr) {
          const int64_t first = batch.frame_offsets[static_cast<std::size_t>(c)] * cols;
          store_row(clip, static_cast<int>(batch.frames(c) * cols), half + first);
        }
      }
    });
  }

  /// Computes block `block` of segment `x` into the segment's output `out` ([n_mels][n_frames]).
  template <class Out>
  void run_block(const float* x, int block, Scratch& s, Out* out) const {
    const int t0 = block * block_;
    const int count = std::min(block_, layout_.n_frames - t0);
    if (prep_) {
      fbank_frame_block(x, layout_.segment_samples, t0, count, 0, s);
    } else {
      frame_block(x, layout_.segment_samples, reflect_, t0, count, s.frames.data, s);
    }
    (count == block_ ? plan_block_ : plan_tail_).execute(s.frames.data, s.spectrum.data);
    mel_block(count, s);
    log_block(count, s);
    const int n_mels = layout_.n_mels;
    const auto row = [&](int m) { return s.mel.data + static_cast<std::size_t>(m) * block_; };
    if (count == layout_.n_frames) {
      store_row(s.mel.data, n_mels * count, out);
    } else {
      for (int m = 0; m < n_mels; ++m) {
        store_row(row(m), count, out + static_cast<std::size_t>(m) * layout_.n_frames + t0);
      }
    }
  }

  /// Computes rows [block * block_, block * block_ + count) of a clip batch's output `out` ([F][n_mels]): frames of
  /// one or more clips, framed clip by clip into one FFT batch (padded with zero frames when count < block_).
  template <class Out>
  void run_clip_block(const float* samples, const ClipBatch& batch, int64_t block, Scratch& s, Out* out) const {
    const int64_t g0 = block * block_;
    const int count = static_cast<int>(std::min<int64_t>(block_, batch.total_frames() - g0));
    const auto& fo = batch.frame_offsets;
    auto c = static_cast<int64_t>(std::upper_bound(fo.begin(), fo.end(), g0) - fo.begin()) - 1;
    for (int row = 0; row < count; ++c) {
      const int64_t t0 = g0 + row - fo[static_cast<std::size_t>(c)];
      const int k = static_cast<int>(std::min<int64_t>(count - row, batch.frames(c) - t0));
      const int64_t len = batch.samples(c);
      const float* x = samples == nullptr ? nullptr : samples + batch.sample_offsets[static_cast<std::size_t>(c)];
      if (prep_) {
        fbank_frame_block(x, len, t0, k, row, s);
      } else {
        frame_block(x, len, clip_reflects(len, pad_, reflect_), t0, k,
                    s.frames.data + static_cast<std::size_t>(row) * n_fft_, s);
      }
      row += k;
    }
    float* unused = s.frames.data + static_cast<std::size_t>(count) * n_fft_;
    std::fill(unused, unused + static_cast<std::size_t>(block_ - count) * n_fft_, 0.0f);
    plan_block_.execute(s.frames.data, s.spectrum.data);
    mel_block(count, s);
    log_block(count, s);
    store_frames(s.mel.data, block_, count, layout_.n_mels, out + g0 * layout_.n_mels);
  }

  EngineConfig config_;
  MelLayout layout_;
  std::shared_ptr<const Filterbank> fb_;
  LogStage log_;
  int n_fft_ = 0;
  int hop_ = 0;
  int pad_ = 0;
  bool reflect_ = false;
  int block_ = 1;
  int blocks_per_segment_ = 1;
  int threads_ = 1;
  /// |X|^power's exponent: mel's power, or fbank's use_power ? 2 : 1.
  float power_ = 2.0f;
  /// fbank: the per-frame preprocessing; null for mel.
  std::unique_ptr<fbank::FramePrep> prep_;
  /// Filterbank rows (mel: n_mels; fbank: num_mel_bins) and the first of them in s.mel.
  int mel_rows_ = 0;
  int mel_row0_ = 0;
  /// fbank use_energy: the row of s.mel (the output column) holding the log energy; -1 otherwise.
  int energy_row_ = -1;
  /// fbank subtract_mean.
  bool subtract_mean_ = false;
  std::vector<float> window_;
  int64_t host_bytes_ = 0;
  std::vector<Scratch> scratch_;
  R2cPlan plan_block_;
  R2cPlan plan_tail_;
  std::mutex compute_mutex_;
  std::atomic<double> compute_s_{0.0};
};

}  // namespace

bool cpu_power_transposed(const float* spectrum, int count, int n_freqs, float power, float* out, int64_t stride,
                          bool tiles) {
  const auto row = [&](int k) { return out + static_cast<std::size_t>(k) * static_cast<std::size_t>(stride); };
  int tiled_bins = 0, tiled_frames = 0;
#if MELFORGE_AVX2_TILES
  if (tiles && power == 2.0f && cpu_has_avx2()) {
    tiled_bins = n_freqs / 8 * 8;
    tiled_frames = count / 8 * 8;
    for (int f0 = 0; f0 < tiled_frames; f0 += 8) {
      for (int k0 = 0; k0 < tiled_bins; k0 += 8) {
        power_tile(spectrum + 2 * (static_cast<std::size_t>(f0) * n_freqs + k0), n_freqs, row(k0) + f0,
                   static_cast<std::size_t>(stride));
      }
    }
  }
#else
  (void)tiles;
#endif
  for (int k = 0; k < n_freqs; ++k) {
    const int f0 = k < tiled_bins ? tiled_frames : 0;
    power_row(spectrum + 2 * (static_cast<std::size_t>(f0) * n_freqs + k), n_freqs, power, row(k) + f0, count - f0);
  }
  return tiled_frames > 0 && tiled_bins > 0;
}

int cpu_block_frames(int n_frames, int n_fft) {
  constexpr int kBlockFloats = 32768;
  return std::clamp(kBlockFloats / std::max(n_fft, 1), 1, std::max(n_frames, 1));
}

CpuScratchSizes cpu_scratch_sizes(int block, int n_fft, int hop, int n_freqs, int n_mels) {
  CpuScratchSizes s;
  s.padded_floats = static_cast<int64_t>(block - 1) * hop + n_fft;
  s.frame_floats = static_cast<int64_t>(block) * n_fft;
  s.spectrum_complex = static_cast<int64_t>(block) * n_freqs;
  s.power_floats = static_cast<int64_t>(n_freqs) * block;
  s.mel_floats = static_cast<int64_t>(n_mels) * block;
  return s;
}

CpuScratchSizes cpu_scratch_sizes(const EngineConfig& config) {
  const MelLayout layout = make_layout(config);
  const int n_fft = config.mel.n_fft;
  const int block = cpu_block_frames(layout.n_frames, n_fft);
  if (!config.mel.is_fbank()) return cpu_scratch_sizes(block, n_fft, config.mel.hop(), layout.n_freqs, layout.n_mels);
  CpuScratchSizes s;
  s.frame_floats = static_cast<int64_t>(block) * n_fft;
  s.spectrum_complex = static_cast<int64_t>(block) * layout.n_freqs;
  s.power_floats = static_cast<int64_t>(layout.n_freqs) * block;
  s.mel_floats = static_cast<int64_t>(layout.n_mels) * block;
  s.gather_floats = config.mel.win();
  s.prep_floats = config.mel.fbank.dither > 0.0 ? config.mel.win() : 0;
  if (config.mel.fbank.subtract_mean) s.segment_floats = layout.out_elems_per_segment();
  return s;
}

int64_t cpu_engine_host_bytes(const EngineConfig& config) {
  const int64_t window = config.mel.is_fbank() ? config.mel.win() : config.mel.n_fft;
  return resolve_threads(config.threads) * cpu_scratch_sizes(config).bytes() +
         window * static_cast<int64_t>(sizeof(float));
}

void cpu_log_compress(float* values, int64_t count, const MelArgs& args) { LogStage(args).apply(values, count); }

std::unique_ptr<MelEngine> make_cpu_engine(const EngineConfig& config) {
  return std::make_unique<CpuMelEngine>(config);
}

}  // namespace melforge::mel
