// [cuda] tests of Kaldi fbank (MelArgs::features fbank) on the CUDA engine against the CPU engine: whole clips
// (compute_clips, ragged batches with clips shorter than a window), equal segments (compute), one engine reused, and
// the device memory it reports. Linked with the main that exits 77 (skipped) without a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fbank_cuda_cases.h"
#include "mel/filterbank.h"
#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#include "mel_clips.h"
#include "mel_reference.h"

namespace melforge_test_fbank_cuda {

using namespace melforge;
using namespace melforge::mel;
using melforge::test::FbankCase;

namespace {

/// Output elements as floats (half bits decoded for float16).
std::vector<float> decode(const std::vector<unsigned char>& out, DType dtype) {
  const int elem = dtype == DType::float16 ? 2 : 4;
  std::vector<float> v(out.size() / static_cast<size_t>(elem));
  for (size_t i = 0; i < v.size(); ++i) v[i] = test::element(out, static_cast<int64_t>(i), elem);
  return v;
}

/// Tolerance of one element whose CPU value is `want`: float32 FFT rounding (cuFFT against FFTW) carried through the
/// log, plus half rounding for float16. Log values (also after subtract_mean) get an absolute 5e-3 (the mel CUDA
/// tests' bound) plus a relative 2e-4 (2e-3 for float16: half's 2^-11 with margin); linear energies (use_log_fbank
/// false) the same relative bound plus 1e-5 of the largest magnitude, as the mel tests' log none.
double tolerance(double want, double scale, const FbankCase& c, DType dtype) {
  const double rel = dtype == DType::float16 ? 2e-3 : 2e-4;
  const double abs_tol = c.fbank.use_log_fbank ? 5e-3 : 1e-5 * scale;
  return rel * std::abs(want) + abs_tol;
}

/// Checks every element of the CUDA output against the CPU output; `row_elems` names a failing element's row.
void require_close(const std::vector<unsigned char>& cuda_out, const std::vector<unsigned char>& cpu_out,
                   const FbankCase& c, DType dtype, int64_t row_elems) {
  REQUIRE(cuda_out.size() == cpu_out.size());
  const std::vector<float> a = decode(cuda_out, dtype);
  const std::vector<float> b = decode(cpu_out, dtype);
  double scale = 0.0;
  for (const float v : b) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(b[i]));
    const double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(diff <= tolerance(b[i], scale, c, dtype))) {
      FAIL("row " << i / static_cast<size_t>(row_elems) << " element " << i % static_cast<size_t>(row_elems)
                  << ": cuda " << a[i] << ", cpu " << b[i]);
    }
  }
}

/// compute_clips of `engine` with every output byte preset to 0xff (a NaN for either dtype).
std::vector<unsigned char> run_clips(MelEngine& engine, const std::vector<float>& signal, const ClipBatch& batch) {
  std::vector<unsigned char> out(static_cast<size_t>(batch.out_bytes()), 0xff);
  engine.compute_clips(signal.data(), batch, out.data());
  return out;
}

/// compute() of `engine` with every output byte preset to 0xff.
std::vector<unsigned char> run_segments(MelEngine& engine, const std::vector<float>& signal,
                                        const std::vector<int64_t>& offsets) {
  std::vector<unsigned char> out(offsets.size() * static_cast<size_t>(engine.layout().out_bytes_per_segment()), 0xff);
  engine.compute(signal.data(), offsets, out.data());
  return out;
}

/// Clips of kFbankClipLengths scaled to the set's sample rate (the lengths are for 8-16 kHz), laid end to end.
std::vector<int64_t> clip_offsets_for(const FbankCase& c, int64_t start) {
  std::vector<int64_t> lengths = test::kFbankClipLengths;
  if (c.sample_rate == 8000) {
    for (int64_t& n : lengths) n = n > 1 ? n / 2 : n;
  }
  return test::clip_offsets(lengths, start);
}

}  // namespace

TEST_CASE("CUDA fbank compute_clips matches the CPU engine on ragged batches", "[cuda][fbank]") {
  const FbankCase c = GENERATE(from_range(test::fbank_cases()));
  const DType dtype = GENERATE(DType::float16, DType::float32);
  INFO(c.name << ", " << to_string(dtype) << ", device batch " << c.device_batch);
  const EngineConfig config = c.config(dtype);
  const std::vector<int64_t> offsets = clip_offsets_for(c, 5);
  const std::vector<float> signal = test::clip_signal(offsets.back() + 3, 29);
  const ClipBatch batch = plan_clips(config.mel, dtype, offsets);
  REQUIRE(batch.n_mels == c.fbank.bins());
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  REQUIRE(cuda_engine->layout().n_mels == c.fbank.bins());
  require_close(run_clips(*cuda_engine, signal, batch), run_clips(*cpu_engine, signal, batch), c, dtype,
                batch.n_mels);
}

TEST_CASE("CUDA fbank compute() matches the CPU engine for counts below, at and above the device batch",
          "[cuda][fbank]") {
  const FbankCase c = GENERATE(from_range(test::fbank_cases()));
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const int64_t count = GENERATE_COPY(int64_t{1}, c.device_batch, 2 * c.device_batch + 1);
  INFO(c.name << ", " << to_string(dtype) << ", " << count << " segments, device batch " << c.device_batch);
  const EngineConfig config = c.config(dtype);
  const int64_t signal_len = 3 * c.segment_samples + 77;
  const std::vector<float> signal = test::clip_signal(signal_len, 31);
  const std::vector<int64_t> offsets = test::make_offsets(count, signal_len, c.segment_samples, 6);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  REQUIRE(cuda_engine->layout().n_frames == cpu_engine->layout().n_frames);
  REQUIRE(cuda_engine->layout().out_bytes_per_segment() == cpu_engine->layout().out_bytes_per_segment());
  require_close(run_segments(*cuda_engine, signal, offsets), run_segments(*cpu_engine, signal, offsets), c, dtype,
                cuda_engine->layout().out_elems_per_segment());
}

TEST_CASE("one CUDA fbank engine is reused across compute_clips() and compute() calls", "[cuda][fbank]") {
  const FbankCase c = GENERATE(test::fbank_case_subtract_mean(), test::fbank_case_dither());
  const DType dtype = GENERATE(DType::float16, DType::float32);
  const EngineConfig config = c.config(dtype);
  auto cuda_engine = make_cuda_engine(config);
  auto cpu_engine = make_cpu_engine(config);
  const std::vector<float> signal = test::clip_signal(60000, 37);
  for (int round = 0; round < 3; ++round) {
    INFO(c.name << ", " << to_string(dtype) << ", round " << round);
    const ClipBatch batch =
        plan_clips(config.mel, dtype, test::clip_offsets({9001, int64_t{150} + round, 20000, 401, 0}, 97 * round));
    require_close(run_clips(*cuda_engine, signal, batch), run_clips(*cpu_engine, signal, batch), c, dtype,
                  batch.n_mels);
    const std::vector<int64_t> offsets =
        test::make_offsets(2 * c.device_batch + round, 60000, c.segment_samples, 40 + static_cast<unsigned>(round));
    require_close(run_segments(*cuda_engine, signal, offsets), run_segments(*cpu_engine, signal, offsets), c, dtype,
                  cuda_engine->layout().out_elems_per_segment());
  }
  const ClipBatch none = plan_clips(config.mel, dtype, std::vector<int64_t>{0});
  cuda_engine->compute_clips(nullptr, none, nullptr);
  const EngineTimes t = cuda_engine->times();
  CHECK(t.compute_s > 0.0);
  CHECK(t.h2d_s >= 0.0);
  CHECK(t.d2h_s >= 0.0);
}

TEST_CASE("CUDA fbank engine reports its device and pinned memory, fbank buffers included", "[cuda][fbank]") {
  const FbankCase c = GENERATE(test::fbank_case_80_hamming(), test::fbank_case_subtract_mean());
  INFO(c.name);
  const EngineConfig config = c.config(DType::float16);
  auto engine = make_cuda_engine(config);
  const MelLayout& layout = engine->layout();
  const cuda::CudaBufferSizes sizes = cuda::cuda_buffer_sizes(
      layout, config.mel.n_fft, c.device_batch, cached_filterbank(config.mel)->nnz(), &config.mel.fbank);
  const cuda::CudaClipSizes clip = cuda::cuda_clip_sizes(sizes, config.mel.n_fft, config.mel.hop());
  CHECK(sizes.energy_floats == (c.fbank.use_energy ? sizes.frame_rows : 0));
  CHECK(sizes.mean_floats == (c.fbank.subtract_mean ? sizes.output_elems : 0));
  CHECK(clip.stat_doubles == (c.fbank.subtract_mean ? clip.pieces * layout.n_mels : 0));
  CHECK(engine->host_bytes() == 2 * (sizes.slot_pinned_bytes() + clip.extra_slot_bytes(sizes)));
  CHECK(engine->device_bytes() >= 2 * (sizes.slot_device_bytes() + clip.extra_slot_bytes(sizes)) +
                                      sizes.shared_device_bytes());
}

}  // namespace melforge_test_fbank_cuda
