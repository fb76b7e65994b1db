// CPU tests of the CUDA mel engine's kernel bodies: the same grid the kernels launch, looped on the host, chained
// gather -> naive double DFT -> mel, and compared with a naive double-precision reference. Needs no device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

#if defined(MELFORGE_HAVE_CUDA)

#include "mel/filterbank.h"
#include "mel/mel_cuda.h"
#include "mel/mel_cuda_kernels.h"
#include "mel/mel_math.h"
#include "mel_cuda_reference.h"
#include "mel_reference.h"

namespace melforge_test_mel_cuda_bodies {

using namespace melforge;
using namespace melforge::mel;
using melforge::test::half_to_float;
using melforge::test::make_offsets;
using melforge::test::naive_rfft;
using namespace melforge::mel::cuda;

namespace {

/// One test shape: spectrogram parameters, segment length, dtype, device batch and how many segments to compute.
struct Shape {
  std::string name;
  MelArgs mel;
  int64_t segment_samples = 0;
  DType dtype = DType::float32;
  int64_t device_batch = 1;
  int64_t count = 1;
};

Shape shape_center_reflect() {
  Shape s{"center reflect hann fp32 db, 10 segments in batches of 4", {}, 300, DType::float32, 4, 10};
  s.mel.sample_rate = 16000;
  s.mel.n_fft = 64;
  s.mel.n_mels = 10;
  return s;
}

Shape shape_center_constant() {
  Shape s{"center constant hamming win<n_fft fp16 ln, 7 segments in batches of 3", {}, 257, DType::float16, 3, 7};
  s.mel.sample_rate = 16000;
  s.mel.n_fft = 64;
  s.mel.win_length = 40;
  s.mel.hop_length = 16;
  s.mel.window = Window::hamming;
  s.mel.pad_mode = PadMode::constant;
  s.mel.n_mels = 8;
  s.mel.log = LogMode::ln;
  return s;
}

Shape shape_no_center() {
  Shape s{"no center win<n_fft slaney power 1 fp16 db, 5 segments in a batch of 5", {}, 600, DType::float16, 5, 5};
  s.mel.sample_rate = 16000;
  s.mel.n_fft = 128;
  s.mel.win_length = 100;
  s.mel.hop_length = 37;
  s.mel.center = false;
  s.mel.power = 1.0f;
  s.mel.n_mels = 16;
  s.mel.mel_scale = MelScale::slaney;
  s.mel.mel_norm = MelNorm::slaney;
  return s;
}

Shape shape_log_none() {
  Shape s{"no center fp32 log none, 3 segments in a batch of 8", {}, 100, DType::float32, 8, 3};
  s.mel.sample_rate = 8000;
  s.mel.n_fft = 32;
  s.mel.hop_length = 8;
  s.mel.center = false;
  s.mel.n_mels = 6;
  s.mel.log = LogMode::none;
  return s;
}

Shape shape_fmin_fmax() {
  Shape s{"center reflect f_min/f_max win<n_fft fp16 db, 5 segments in batches of 2", {}, 1000, DType::float16, 2, 5};
  s.mel.sample_rate = 16000;
  s.mel.n_fft = 256;
  s.mel.win_length = 200;
  s.mel.hop_length = 80;
  s.mel.n_mels = 24;
  s.mel.f_min = 50.0f;
  s.mel.f_max = 7000.0f;
  return s;
}

EngineConfig config_of(const Shape& s) {
  EngineConfig c;
  c.mel = s.mel;
  c.segment_samples = s.segment_samples;
  c.dtype = s.dtype;
  c.device_batch = s.device_batch;
  return c;
}

/// A noisy two-tone signal of `n` samples in about [-1, 1].
std::vector<float> make_signal(int64_t n, unsigned seed) {
  return test::tone_signal(n, seed, {0.4, 0.05, 0.2, 0.9, 1.0, 0.3f});
}


/// Output element i of a buffer of `dtype` as float.
float output_value(const std::vector<unsigned char>& out, int64_t i, DType dtype) {
  return test::element(out, i, dtype == DType::float16 ? 2 : 4);
}

/// The engine's host flow with the kernel bodies in place of the kernels: batches of device_batch (the last one
/// zero-padded), every buffer sized by cuda_buffer_sizes(), the exact launch grids. Returns [count][n_mels][n_frames]
/// output bytes in the configured dtype.
std::vector<unsigned char> run_bodies(const EngineConfig& config, const std::vector<float>& signal,
                                      const std::vector<int64_t>& offsets) {
  const MelLayout layout = make_layout(config);
  const auto fb = cached_filterbank(config.mel);
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, config.mel.n_fft, config.device_batch, fb->nnz());
  const std::vector<float> window = window_table(config.mel);
  const std::vector<int32_t> bands = filterbank_band_table(*fb);
  REQUIRE(static_cast<int64_t>(window.size()) == sizes.window_floats);
  REQUIRE(static_cast<int64_t>(bands.size()) == sizes.filterbank_ints);
  REQUIRE(static_cast<int64_t>(fb->weights.size()) == sizes.filterbank_weights);

  std::vector<float> input(static_cast<size_t>(sizes.input_floats));
  std::vector<float> frames(static_cast<size_t>(sizes.frame_floats));
  std::vector<float2> spectrum(static_cast<size_t>(sizes.spectrum_complex));
  std::vector<unsigned char> batch_out(static_cast<size_t>(sizes.output_bytes()));

  GatherParams g;
  g.input = input.data();
  g.window = window.data();
  g.frames = frames.data();
  g.segment_samples = layout.segment_samples;
  g.frame_rows = sizes.frame_rows;
  g.n_fft = config.mel.n_fft;
  g.hop = config.mel.hop();
  g.pad = config.mel.pad();
  g.n_frames = layout.n_frames;
  g.reflect = config.mel.pad_mode == PadMode::reflect;

  MelParams m;
  m.spectrum = spectrum.data();
  m.bands = bands.data();
  m.weights = fb->weights.data();
  m.out = batch_out.data();
  m.total = sizes.output_elems;
  m.n_mels = layout.n_mels;
  m.n_frames = layout.n_frames;
  m.n_freqs = layout.n_freqs;
  m.power = config.mel.power;
  m.log_mode = static_cast<int>(config.mel.log);
  m.amin = config.mel.amin;
  m.log_eps = config.mel.log_eps;
  m.fp16 = config.dtype == DType::float16;

  const auto n = static_cast<int64_t>(offsets.size());
  const int64_t per_segment = layout.out_bytes_per_segment();
  std::vector<unsigned char> out(static_cast<size_t>(n * per_segment));
  for (int64_t k = 0; k < batch_count(n, sizes.batch); ++k) {
    const int64_t first = k * sizes.batch;
    const int64_t count = std::min(sizes.batch, n - first);
    fill_batch_input(input.data(), signal.data(), offsets, first, count, layout.segment_samples, sizes);
    for (int64_t block = 0; block < gather_grid(sizes.frame_rows); ++block) {
      for (int thread = 0; thread < kGatherBlock; ++thread) gather_frame(g, block, thread, kGatherBlock);
    }
    naive_rfft(frames, config.mel.n_fft, sizes.frame_rows, spectrum);
    for (int64_t block = 0; block < mel_grid(sizes.output_elems); ++block) {
      for (int thread = 0; thread < kMelBlock; ++thread) mel_element(m, block, thread, kMelBlock);
    }
    std::memcpy(out.data() + first * per_segment, batch_out.data(), static_cast<size_t>(count * per_segment));
  }
  return out;
}

/// Naive log-mel of one segment in double: torch.stft framing with mel_math.h's window and padding, a direct DFT,
/// the dense filterbank, and the log. Returns [n_mels][n_frames].
std::vector<double> reference_segment(const MelArgs& a, const float* x, int64_t len) {
  const int n_fft = a.n_fft;
  const int n_freqs = a.n_freqs();
  const int n_frames = frame_count(len, n_fft, a.hop(), a.pad());
  const int win = a.win();
  const int left = (n_fft - win) / 2;
  const std::vector<float> fb = build_filterbank(a).dense();
  const double pi = 3.14159265358979323846;
  std::vector<double> out(static_cast<size_t>(a.n_mels) * n_frames, 0.0);
  std::vector<double> frame(static_cast<size_t>(n_fft));
  std::vector<double> power(static_cast<size_t>(n_freqs));
  for (int t = 0; t < n_frames; ++t) {
    for (int n = 0; n < n_fft; ++n) {
      const bool inside = n >= left && n < left + win;
      const double w = !inside ? 0.0 : a.window == Window::hann ? hann(n - left, win) : hamming(n - left, win);
      const int64_t pos = static_cast<int64_t>(t) * a.hop() + n;
      frame[static_cast<size_t>(n)] = w * padded_sample(x, len, pos, a.pad(), a.pad_mode == PadMode::reflect);
    }
    for (int k = 0; k < n_freqs; ++k) {
      double re = 0.0;
      double im = 0.0;
      for (int n = 0; n < n_fft; ++n) {
        re += frame[static_cast<size_t>(n)] * std::cos(2.0 * pi * k * n / n_fft);
        im -= frame[static_cast<size_t>(n)] * std::sin(2.0 * pi * k * n / n_fft);
      }
      power[static_cast<size_t>(k)] = std::pow(re * re + im * im, 0.5 * a.power);
    }
    for (int m = 0; m < a.n_mels; ++m) {
      double e = 0.0;
      for (int k = 0; k < n_freqs; ++k) {
        e += power[static_cast<size_t>(k)] * fb[static_cast<size_t>(k) * a.n_mels + m];
      }
      double v = e;
      if (a.log == LogMode::db) v = (20.0 / a.power) * std::log10(std::max(e, static_cast<double>(a.amin)));
      if (a.log == LogMode::ln) v = std::log(e + a.log_eps);
      out[static_cast<size_t>(m) * n_frames + t] = v;
    }
  }
  return out;
}

/// Allowed |engine - reference|: float32 rounding of the chain, plus half rounding for float16.
double tolerance(double ref, double scale, DType dtype, LogMode log) {
  const double rel = dtype == DType::float16 ? 2e-3 : 2e-4;
  if (log == LogMode::none) return rel * std::abs(ref) + 1e-5 * scale;
  return rel * std::abs(ref) + 2e-3;
}

}  // namespace

TEST_CASE("CUDA kernel bodies on the kernel grid match a naive double reference", "[mel][cuda_bodies]") {
  const Shape shape =
      GENERATE(shape_center_reflect(), shape_center_constant(), shape_no_center(), shape_log_none(), shape_fmin_fmax());
  INFO(shape.name);
  const EngineConfig config = config_of(shape);
  const MelLayout layout = make_layout(config);
  const int64_t signal_len = 3 * shape.segment_samples + 17;
  const std::vector<float> signal = make_signal(signal_len, 7);
  const std::vector<int64_t> offsets = make_offsets(shape.count, signal_len, shape.segment_samples, 11);
  REQUIRE((shape.count % shape.device_batch != 0 || shape.count == shape.device_batch));

  const std::vector<unsigned char> out = run_bodies(config, signal, offsets);
  REQUIRE(static_cast<int64_t>(out.size()) == shape.count * layout.out_bytes_per_segment());

  int64_t checked = 0;
  for (int64_t i = 0; i < shape.count; ++i) {
    const std::vector<double> ref =
        reference_segment(shape.mel, signal.data() + offsets[static_cast<size_t>(i)], shape.segment_samples);
    REQUIRE(static_cast<int64_t>(ref.size()) == layout.out_elems_per_segment());
    double scale = 0.0;
    for (double r : ref) scale = std::max(scale, std::abs(r));
    for (int64_t e = 0; e < layout.out_elems_per_segment(); ++e) {
      const double got = output_value(out, i * layout.out_elems_per_segment() + e, shape.dtype);
      const double want = ref[static_cast<size_t>(e)];
      if (std::abs(got - want) > tolerance(want, scale, shape.dtype, shape.mel.log)) {
        FAIL("segment " << i << " element " << e << " (band " << e / layout.n_frames << ", frame "
                        << e % layout.n_frames << "): bodies " << got << ", reference " << want);
      }
      ++checked;
    }
  }
  CHECK(checked == shape.count * layout.out_elems_per_segment());
}

TEST_CASE("CUDA buffer sizes are exactly what the kernel bodies index", "[mel][cuda_bodies]") {
  const Shape shape =
      GENERATE(shape_center_reflect(), shape_center_constant(), shape_no_center(), shape_log_none(), shape_fmin_fmax());
  INFO(shape.name);
  const EngineConfig config = config_of(shape);
  const MelLayout layout = make_layout(config);
  const auto fb = cached_filterbank(config.mel);
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, config.mel.n_fft, config.device_batch, fb->nnz());
  const int64_t S = layout.segment_samples;
  const int n_fft = config.mel.n_fft;
  REQUIRE(sizes.input_floats < (int64_t{1} << 24));
  constexpr int64_t guard = 64;

  SECTION("gather writes every frame element once and reads only its own segment") {
    std::vector<float> input(static_cast<size_t>(sizes.input_floats + 2 * guard),
                             std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < sizes.input_floats; ++i) input[static_cast<size_t>(guard + i)] = static_cast<float>(i + 1);
    const std::vector<float> ones(static_cast<size_t>(sizes.window_floats), 1.0f);
    const float sentinel = -1.0f;
    std::vector<float> frames(static_cast<size_t>(sizes.frame_floats + guard), sentinel);
    GatherParams g;
    g.input = input.data() + guard;
    g.window = ones.data();
    g.frames = frames.data();
    g.segment_samples = S;
    g.frame_rows = sizes.frame_rows;
    g.n_fft = n_fft;
    g.hop = config.mel.hop();
    g.pad = config.mel.pad();
    g.n_frames = layout.n_frames;
    g.reflect = config.mel.pad_mode == PadMode::reflect;
    for (int64_t block = 0; block < gather_grid(sizes.frame_rows); ++block) {
      for (int thread = 0; thread < kGatherBlock; ++thread) gather_frame(g, block, thread, kGatherBlock);
    }

    int64_t max_read = -1;
    int64_t max_written = -1;
    for (int64_t i = 0; i < sizes.frame_floats; ++i) {
      const float v = frames[static_cast<size_t>(i)];
      REQUIRE_FALSE(std::isnan(v));
      REQUIRE(v != sentinel);
      max_written = i;
      if (v == 0.0f) {
        REQUIRE_FALSE(g.reflect);
        continue;
      }
      const auto read = static_cast<int64_t>(v) - 1;
      const int64_t segment = i / n_fft / layout.n_frames;
      REQUIRE(read >= segment * S);
      REQUIRE(read < (segment + 1) * S);
      max_read = std::max(max_read, read);
    }
    for (int64_t i = 0; i < guard; ++i) REQUIRE(frames[static_cast<size_t>(sizes.frame_floats + i)] == sentinel);
    CHECK(max_written + 1 == sizes.frame_floats);
    CHECK(max_read + 1 <= sizes.input_floats);
    CHECK(max_read >= (sizes.batch - 1) * S);
    CHECK(sizes.frame_floats == sizes.frame_rows * n_fft);
    CHECK(sizes.frame_rows == sizes.batch * layout.n_frames);
  }

  SECTION("mel writes every output element once and reads only sized spectra and filterbank entries") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float2> spectrum(static_cast<size_t>(sizes.spectrum_complex + 2 * guard), float2{nan, nan});
    for (int64_t i = 0; i < sizes.spectrum_complex; ++i) {
      spectrum[static_cast<size_t>(guard + i)] = float2{1.0f + static_cast<float>(i % 5), 0.5f};
    }
    const std::vector<int32_t> bands = filterbank_band_table(*fb);
    REQUIRE(static_cast<int64_t>(bands.size()) == sizes.filterbank_ints);
    REQUIRE(static_cast<int64_t>(fb->weights.size()) == sizes.filterbank_weights);
    const int32_t max_end = *std::max_element(bands.begin() + layout.n_mels, bands.begin() + 2 * layout.n_mels);
    CHECK(max_end <= layout.n_freqs);
    CHECK(bands.back() == sizes.filterbank_weights);

    const int elem = sizes.out_elem_bytes;
    const uint32_t nan32 = 0x7fc00001u;
    const uint16_t nan16 = 0x7e01u;
    std::vector<unsigned char> out(static_cast<size_t>((sizes.output_elems + guard) * elem));
    for (int64_t i = 0; i < sizes.output_elems + guard; ++i) {
      if (elem == 2) {
        std::memcpy(out.data() + i * 2, &nan16, 2);
      } else {
        std::memcpy(out.data() + i * 4, &nan32, 4);
      }
    }
    const std::vector<unsigned char> guard_bytes(out.end() - guard * elem, out.end());

    MelParams m;
    m.spectrum = spectrum.data() + guard;
    m.bands = bands.data();
    m.weights = fb->weights.data();
    m.out = out.data();
    m.total = sizes.output_elems;
    m.n_mels = layout.n_mels;
    m.n_frames = layout.n_frames;
    m.n_freqs = layout.n_freqs;
    m.power = config.mel.power;
    m.log_mode = static_cast<int>(config.mel.log);
    m.amin = config.mel.amin;
    m.log_eps = config.mel.log_eps;
    m.fp16 = shape.dtype == DType::float16;
    for (int64_t block = 0; block < mel_grid(sizes.output_elems); ++block) {
      for (int thread = 0; thread < kMelBlock; ++thread) mel_element(m, block, thread, kMelBlock);
    }

    int64_t max_written = -1;
    for (int64_t i = 0; i < sizes.output_elems; ++i) {
      REQUIRE_FALSE(std::isnan(output_value(out, i, shape.dtype)));
      max_written = i;
    }
    CHECK(max_written + 1 == sizes.output_elems);
    CHECK(std::equal(guard_bytes.begin(), guard_bytes.end(), out.end() - guard * elem));
    CHECK(sizes.output_bytes() == sizes.batch * layout.out_bytes_per_segment());
    CHECK(sizes.spectrum_complex == sizes.frame_rows * layout.n_freqs);
  }
}

TEST_CASE("fill_batch_input copies the batch's segments and zero-pads the rest", "[mel][cuda_bodies]") {
  const int64_t S = 5;
  const int64_t batch = GENERATE(as<int64_t>{}, 1, 3, 4);
  const int64_t count = GENERATE(as<int64_t>{}, 1, 7);
  std::vector<float> signal(40);
  for (size_t i = 0; i < signal.size(); ++i) signal[i] = static_cast<float>(i) + 0.5f;
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) offsets[static_cast<size_t>(i)] = (i * 13) % 30;
  MelLayout layout;
  layout.n_frames = 1;
  layout.n_mels = 1;
  layout.n_freqs = 3;
  layout.segment_samples = S;
  layout.out_elem_bytes = 4;
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, 4, batch, 1);
  REQUIRE(sizes.input_floats == batch * S);
  CHECK(batch_count(count, batch) == (count + batch - 1) / batch);
  int64_t seen = 0;
  for (int64_t k = 0; k < batch_count(count, batch); ++k) {
    std::vector<float> dst(static_cast<size_t>(sizes.input_floats), -9.0f);
    const int64_t first = k * batch;
    const int64_t n = std::min(batch, count - first);
    fill_batch_input(dst.data(), signal.data(), offsets, first, n, S, sizes);
    for (int64_t j = 0; j < batch; ++j) {
      for (int64_t s = 0; s < S; ++s) {
        const float want = j < n ? signal[static_cast<size_t>(offsets[static_cast<size_t>(first + j)] + s)] : 0.0f;
        REQUIRE(dst[static_cast<size_t>(j * S + s)] == want);
      }
    }
    seen += n;
  }
  CHECK(seen == count);
}

TEST_CASE("padded_window centres the window in the frame as torch.stft does", "[mel][cuda_bodies]") {
  const int n_fft = 16;
  const int win = GENERATE(16, 11, 10, 1);
  const Window window = GENERATE(Window::hann, Window::hamming);
  const int left = (n_fft - win) / 2;
  for (int n = 0; n < n_fft; ++n) {
    const float want = n < left || n >= left + win ? 0.0f
                       : window == Window::hann    ? hann(n - left, win)
                                                   : hamming(n - left, win);
    CHECK(padded_window(n, n_fft, win, window) == want);
  }
}

TEST_CASE("mel body stores IEEE half bits for float16", "[mel][cuda_bodies]") {
  const float value = GENERATE(0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 1234.567f);
  const float2 spectrum[1] = {float2{value, 0.0f}};
  const std::vector<int32_t> bands = {0, 1, 0, 1};
  const std::vector<float> weights = {1.0f};
  uint16_t half = 0xffff;
  float single = 0.0f;
  MelParams m;
  m.spectrum = spectrum;
  m.bands = bands.data();
  m.weights = weights.data();
  m.total = 1;
  m.n_mels = 1;
  m.n_frames = 1;
  m.n_freqs = 1;
  m.power = 1.0f;
  m.log_mode = static_cast<int>(LogMode::none);
  m.out = &half;
  m.fp16 = true;
  mel_element(m, 0, 0, kMelBlock);
  m.out = &single;
  m.fp16 = false;
  mel_element(m, 0, 0, kMelBlock);
  CHECK(single == std::abs(value));
  const float back = half_to_float(half);
  CHECK(std::abs(back - single) <= std::ldexp(std::abs(single), -11) + 3e-8f);
}

}  // namespace melforge_test_mel_cuda_bodies

#else

namespace melforge_test_mel_cuda_bodies {

TEST_CASE("built without CUDA: no device and a clear error", "[mel][cuda_bodies]") {
  using namespace melforge;
  CHECK_FALSE(mel::cuda_available());
  mel::EngineConfig config;
  config.segment_samples = 4000;
  CHECK_THROWS_AS(mel::make_cuda_engine(config), CudaError);
}

}  // namespace melforge_test_mel_cuda_bodies

#endif
