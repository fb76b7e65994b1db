// [cuda] tests: the CUDA engine against the CPU engine, for segments (compute) and whole clips (compute_clips).
// Linked with the main that exits 77 (skipped) without a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mel/filterbank.h"
#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#include "mel_clips.h"
#include "mel_reference.h"
#include "melforge/common/errors.h"

namespace melforge_test_mel_cuda {

using namespace melforge;
using namespace melforge::mel;
using melforge::test::half_to_float;
using melforge::test::make_offsets;

namespace {

/// One parameter set: spectrogram parameters, segment length and device batch.
struct Params {
  std::string name;
  MelArgs mel;
  int64_t segment_samples = 0;
  int64_t device_batch = 1;
};

Params params_default() {
  Params p{"defaults (n_fft 512, hann, center reflect, 64 htk mels, db)", {}, 4000, 16};
  return p;
}

Params params_constant_hamming() {
  Params p{"n_fft 400 win 320 hop 160 hamming constant, slaney/slaney, ln", {}, 3200, 7};
  p.mel.n_fft = 400;
  p.mel.win_length = 320;
  p.mel.hop_length = 160;
  p.mel.window = Window::hamming;
  p.mel.pad_mode = PadMode::constant;
  p.mel.n_mels = 40;
  p.mel.mel_scale = MelScale::slaney;
  p.mel.mel_norm = MelNorm::slaney;
  p.mel.log = LogMode::ln;
  return p;
}

Params params_no_center() {
  Params p{"n_fft 256 no center power 1 f_min 60 f_max 7600, db", {}, 2500, 5};
  p.mel.n_fft = 256;
  p.mel.hop_length = 100;
  p.mel.center = false;
  p.mel.power = 1.0f;
  p.mel.n_mels = 32;
  p.mel.f_min = 60.0f;
  p.mel.f_max = 7600.0f;
  return p;
}

Params params_log_none() {
  Params p{"n_fft 1024 hop 256 at 22050 Hz, 80 mels, log none", {}, 6000, 3};
  p.mel.sample_rate = 22050;
  p.mel.n_fft = 1024;
  p.mel.hop_length = 256;
  p.mel.n_mels = 80;
  p.mel.log = LogMode::none;
  return p;
}

Params params_default_big_batch() {
  Params p = params_default();
  p.name = "defaults, device batch 4096: one clip launch of 65536 rows";
  p.device_batch = 4096;
  return p;
}

/// Clip lengths around n_fft 256..512 and their halves, hop-sized clips, 0.3 s / 1.37 s / 4.01 s at 16 kHz, empty
/// clips.
const std::vector<int64_t> kClipLengths512 = {1,   0,   2,   99,  100, 128,  199, 200,   255,   256, 257,
                                              399, 400, 511, 512, 513, 4800, 3,   21920, 64160, 160, 0};

/// compute_clips of `engine`; every output byte preset to 0xff (a NaN for either dtype).
std::vector<unsigned char> run_clips(MelEngine& engine, const std::vector<float>& signal, const ClipBatch& batch) {
  std::vector<unsigned char> out(static_cast<size_t>(batch.out_bytes()), 0xff);
  engine.compute_clips(signal.data(), batch, out.data());
  return out;
}

EngineConfig config_of(const Params& p, DType dtype) {
  EngineConfig c;
  c.mel = p.mel;
  c.segment_samples = p.segment_samples;
  c.dtype = dtype;
  c.threads = 2;
  c.device_batch = p.device_batch;
  return c;
}

std::vector<float> make_signal(int64_t n, unsigned seed) {
  return test::tone_signal(n, seed, {0.5, 0.013, 0.25, 0.71, 0.3, 0.2f});
}

std::vector<float> decode(const std::vector<unsigned char>& out, DType dtype) {
  const size_t elem = dtype == DType::float16 ? 2 : 4;
  std::vector<float> v(out.size() / elem);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::float16) {
      uint16_t h = 0;
      std::memcpy(&h, out.data() + i * 2, 2);
      v[i] = half_to_float(h);
    } else {
      std::memcpy(&v[i], out.data() + i * 4, 4);
    }
  }
  return v;
}

std::vector<unsigned char> run(MelEngine& engine, const std::vector<float>& signal,
                               const std::vector<int64_t>& offsets) {
  std::vector<unsigned char> out(offsets.size() * static_cast<size_t>(engine.layout().out_bytes_per_segment()), 0xcd);
  engine.compute(signal.data(), offsets, out.data());
  return out;
}

/// Checks every element of two engines' outputs agree within float32 FFT rounding (plus half rounding for float16).
void require_close(const std::vector<unsigned char>& cuda_out, const std::vector<unsigned char>& cpu_out,
                   DType dtype, LogMode log, int64_t per_segment) {
  REQUIRE(cuda_out.size() == cpu_out.size());
  const std::vector<float> a = decode(cuda_out, dtype);
  const std::vector<float> b = decode(cpu_out, dtype);
  double scale = 0.0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::abs(v)));
  const double rel = dtype == DType::float16 ? 2e-3 : 2e-4;
  const double abs_tol = log == LogMode::none ? 1e-5 * scale : 5e-3;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE_FALSE(std::isnan(a[i]));
    if (std::abs(a[i] - b[i]) > rel * std::abs(b[i]) + abs_tol) {
      FAIL("segment " << i / static_cast<size_t>(per_segment) << " element " << i % static_cast<size_t>(per_segment)
                      << ": cuda " << a[i] << ", cpu " << b[i]);
    }
  }
}

}  // namespace

TEST_CASE("CUDA engine matches the CPU engine for counts below, at and above the device batch", "[cuda]") {
  const Params p = GENERATE(params_default(), params_constant_hamming(), params_no_center(), params_log_none());
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const EngineConfig config = config_of(p, dtype);
  const int64_t count = GENERATE_COPY(int64_t{1}, p.device_batch - 1, p.device_batch, p.device_batch + 1,
                                      2 * p.device_batch + 3, 5 * p.device_batch);
  INFO(p.name << ", " << to_string(dtype) << ", " << count << " segments, device batch " << p.device_batch);
  if (count < 1) return;
  const int64_t signal_len = 4 * p.segment_samples + 101;
  const std::vector<float> signal = make_signal(signal_len, 3);
  const std::vector<int64_t> offsets = make_offsets(count, signal_len, p.segment_samples, 5);

  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  REQUIRE(cuda_engine->name() == "cuda-cufft");
  REQUIRE(cuda_engine->layout().n_frames == cpu_engine->layout().n_frames);
  REQUIRE(cuda_engine->layout().out_bytes_per_segment() == cpu_engine->layout().out_bytes_per_segment());
  require_close(run(*cuda_engine, signal, offsets), run(*cpu_engine, signal, offsets), dtype, p.mel.log,
                cuda_engine->layout().out_elems_per_segment());
}

TEST_CASE("one CUDA engine is reused across compute() calls of different counts", "[cuda]") {
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const Params p = params_constant_hamming();
  const EngineConfig config = config_of(p, dtype);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  const int64_t signal_len = 5 * p.segment_samples;
  const std::vector<float> signal = make_signal(signal_len, 17);
  const int64_t b = p.device_batch;
  unsigned seed = 1;
  for (const int64_t count : {3 * b + 2, int64_t{1}, b, int64_t{0}, 2 * b - 1, 4 * b}) {
    INFO(to_string(dtype) << ", call with " << count << " segments");
    const std::vector<int64_t> offsets = make_offsets(count, signal_len, p.segment_samples, ++seed);
    require_close(run(*cuda_engine, signal, offsets), run(*cpu_engine, signal, offsets), dtype, p.mel.log,
                  cuda_engine->layout().out_elems_per_segment());
  }
  const EngineTimes t = cuda_engine->times();
  CHECK(std::isfinite(t.h2d_s));
  CHECK(std::isfinite(t.compute_s));
  CHECK(std::isfinite(t.d2h_s));
  CHECK(t.h2d_s >= 0.0);
  CHECK(t.compute_s >= 0.0);
  CHECK(t.d2h_s >= 0.0);
}

TEST_CASE("CUDA engine holds device memory and reports it", "[cuda]") {
  const Params p = params_default();
  auto engine = make_cuda_engine(config_of(p, DType::float16));
  const MelLayout& layout = engine->layout();
  const int64_t frames_and_spectra =
      layout.frame_floats(p.device_batch, p.mel.n_fft) * 4 + layout.spectrum_complex(p.device_batch) * 8;
  CHECK(engine->device_bytes() > 0);
  CHECK(engine->device_bytes() >= 2 * frames_and_spectra);
  const int64_t staging = p.device_batch * (layout.segment_samples * 4 + layout.out_bytes_per_segment());
  const cuda::CudaBufferSizes sizes =
      cuda::cuda_buffer_sizes(layout, p.mel.n_fft, p.device_batch, cached_filterbank(p.mel)->nnz());
  const cuda::CudaClipSizes clip = cuda::cuda_clip_sizes(sizes, p.mel.n_fft, p.mel.hop());
  CHECK(sizes.slot_pinned_bytes() == staging);
  CHECK(engine->host_bytes() == 2 * (staging + clip.extra_slot_bytes(sizes)));
  CHECK(engine->device_bytes() >= 2 * (sizes.slot_device_bytes() + clip.extra_slot_bytes(sizes)));
  CHECK(cuda_available());
}

TEST_CASE("CUDA engine rejects an invalid configuration with InvalidArgument", "[cuda]") {
  EngineConfig config = config_of(params_default(), DType::float16);
  SECTION("device batch 0") {
    config.device_batch = 0;
    CHECK_THROWS_AS(make_cuda_engine(config), InvalidArgument);
  }
  SECTION("segment shorter than one frame") {
    config.segment_samples = 10;
    config.mel.center = false;
    CHECK_THROWS_AS(make_cuda_engine(config), InvalidArgument);
  }
}

TEST_CASE("every CUDA device has a kernel image of this build", "[cuda]") {
  const CudaDeviceQuery q = query_cuda_devices();
  INFO("device query: " << q.describe() << "; built for " << describe_cuda_architectures(cuda_architectures()));
  REQUIRE(q.usable());
  for (int d = 0; d < q.count; ++d) {
    const CudaDeviceSupport s = cuda_device_support(d);
    INFO("device " << d << ": " << s.name << " " << s.cc_major << "." << s.cc_minor << ": " << s.problem);
    CHECK(s.supported());
  }
}

TEST_CASE("make_engine(cuda) over every device deals whole device batches and matches the CPU engine", "[cuda]") {
  const Params p = params_default();
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const EngineConfig config = config_of(p, dtype);
  EnginePlan plan;
  auto engine = make_engine(Device::cuda, config, &plan);
  CHECK(plan.error.empty());
  CHECK(static_cast<int>(plan.devices.size()) == cuda_device_count());
  CHECK_THAT(engine->name(), Catch::StartsWith("cuda-cufft"));
  auto cpu_engine = make_cpu_engine(config);
  const int64_t signal_len = 4 * p.segment_samples + 101;
  const std::vector<float> signal = make_signal(signal_len, 11);
  for (const int64_t count : {int64_t{1}, 2 * p.device_batch, 7 * p.device_batch + 3}) {
    INFO(to_string(dtype) << ", " << count << " segments on " << plan.devices.size() << " device(s)");
    const std::vector<int64_t> offsets = make_offsets(count, signal_len, p.segment_samples, 9);
    require_close(run(*engine, signal, offsets), run(*cpu_engine, signal, offsets), dtype, p.mel.log,
                  engine->layout().out_elems_per_segment());
  }
}

TEST_CASE("CUDA and CPU float16 bytes: how many differ and by how many half ulps", "[cuda]") {
  const Params p = GENERATE(params_default(), params_constant_hamming());
  const EngineConfig config = config_of(p, DType::float16);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  const int64_t signal_len = 4 * p.segment_samples + 101;
  const std::vector<float> signal = make_signal(signal_len, 23);
  const std::vector<int64_t> offsets = make_offsets(5 * p.device_batch, signal_len, p.segment_samples, 4);
  const std::vector<unsigned char> a = run(*cuda_engine, signal, offsets);
  const std::vector<unsigned char> b = run(*cpu_engine, signal, offsets);
  REQUIRE(a.size() == b.size());
  int64_t differ = 0;
  int64_t max_ulps = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    uint16_t x = 0;
    uint16_t y = 0;
    std::memcpy(&x, a.data() + i, 2);
    std::memcpy(&y, b.data() + i, 2);
    if (x == y) continue;
    ++differ;
    const auto ordered = [](uint16_t h) { return (h & 0x8000) ? -static_cast<int64_t>(h & 0x7fff) : int64_t{h}; };
    max_ulps = std::max(max_ulps, std::abs(ordered(x) - ordered(y)));
  }
  WARN(p.name << ": " << differ << " of " << a.size() / 2 << " float16 values differ, by at most " << max_ulps
               << " half ulps");
  require_close(a, b, DType::float16, p.mel.log, cuda_engine->layout().out_elems_per_segment());
}

TEST_CASE("CUDA compute_clips matches the CPU engine on ragged batches", "[cuda]") {
  const Params p =
      GENERATE(params_default(), params_constant_hamming(), params_no_center(), params_default_big_batch());
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const bool many_short = GENERATE(false, true);
  INFO(p.name << ", " << to_string(dtype) << (many_short ? ", 500 clips of 1 frame" : ", edge lengths"));
  const EngineConfig config = config_of(p, dtype);
  std::vector<int64_t> lengths = kClipLengths512;
  if (many_short) lengths.assign(500, p.mel.center ? p.mel.hop() - 1 : p.mel.n_fft - 1);
  const std::vector<int64_t> offsets = test::clip_offsets(lengths, 3);
  const std::vector<float> signal = test::clip_signal(offsets.back() + 7, 11);
  const ClipBatch batch = plan_clips(p.mel, dtype, offsets);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  test::check_clips_close(run_clips(*cuda_engine, signal, batch), run_clips(*cpu_engine, signal, batch), batch, p.mel);
}

TEST_CASE("one CUDA engine alternates compute() and compute_clips() calls", "[cuda]") {
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const Params p = params_constant_hamming();
  const EngineConfig config = config_of(p, dtype);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  const std::vector<float> signal = test::clip_signal(100000, 17);
  const std::vector<int64_t> segments = test::make_offsets(11, 100000, p.segment_samples, 3);
  const auto segment_bytes =
      static_cast<size_t>(segments.size()) * static_cast<size_t>(cuda_engine->layout().out_bytes_per_segment());
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const ClipBatch batch =
        plan_clips(p.mel, dtype, test::clip_offsets({777, int64_t{5} + round, 30000, 12}, 100 * round));
    test::check_clips_close(run_clips(*cuda_engine, signal, batch), run_clips(*cpu_engine, signal, batch), batch,
                            p.mel);
    std::vector<unsigned char> a(segment_bytes), b(segment_bytes);
    cuda_engine->compute(signal.data(), segments, a.data());
    cpu_engine->compute(signal.data(), segments, b.data());
    require_close(a, b, dtype, p.mel.log, cuda_engine->layout().out_elems_per_segment());
  }
  const ClipBatch none = plan_clips(p.mel, dtype, std::vector<int64_t>{0});
  cuda_engine->compute_clips(nullptr, none, nullptr);
  const EngineTimes t = cuda_engine->times();
  CHECK(t.h2d_s >= 0.0);
  CHECK(t.compute_s > 0.0);
  CHECK(t.d2h_s >= 0.0);
}

TEST_CASE("make_engine(cuda) over every device deals whole clips and matches the CPU engine", "[cuda]") {
  const Params p = params_default();
  const EngineConfig config = config_of(p, DType::float16);
  auto engine = make_engine(Device::cuda, config);
  auto cpu_engine = make_cpu_engine(config);
  const std::vector<int64_t> offsets = test::clip_offsets(kClipLengths512, 0);
  const std::vector<float> signal = test::clip_signal(offsets.back(), 5);
  const ClipBatch batch = plan_clips(p.mel, DType::float16, offsets);
  test::check_clips_close(run_clips(*engine, signal, batch), run_clips(*cpu_engine, signal, batch), batch, p.mel);
}

TEST_CASE("CUDA compute_clips matches torchaudio's MelSpectrogram of whole clips", "[cuda]") {
  const test::ClipFixtures f = test::load_clip_fixtures();
  for (const auto& set : f.manifest.at("sets")) {
    const Params p{set.at("name"), test::mel_args_from_json(set.at("params")), 4000, 8};
    const ClipBatch batch = plan_clips(p.mel, DType::float32, f.offsets);
    auto engine = make_cuda_engine(config_of(p, DType::float32));
    test::check_clip_fixture(run_clips(*engine, f.signal, batch), batch, set);
  }
}

}  // namespace melforge_test_mel_cuda
