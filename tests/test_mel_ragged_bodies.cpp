// The CUDA engine's whole-clip path without a device: fill_clip_launch (the host side of a clip launch) against the
// batch it fills from, and the clip kernel bodies run on the CPU over the kernels' grid, launch after launch as the
// engine runs them, against the CPU engine's compute_clips.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#include "mel/mel_math.h"
#include "mel_clips.h"
#include "mel_reference.h"

#if defined(MELFORGE_HAVE_CUDA)
#include "mel/filterbank.h"
#include "mel/mel_cuda_kernels.h"
#include "mel_cuda_reference.h"
#endif

namespace melforge_test_mel_ragged_bodies {

using namespace melforge;
using namespace melforge::mel;
using namespace melforge::mel::cuda;
using test::clip_offsets;
using test::clip_signal;
using test::clip_shape_constant;
using test::clip_shape_no_center;
using test::clip_shape_odd;
using test::clip_shape_reflect;
using test::clip_shape_short_launches;
using test::clip_view;
using test::ClipShape;
using test::config_of;
using test::kClipLengths;

namespace {

/// Sizes of clip launches of `rows` rows, as cuda_clip_sizes gives them for a plan of that many rows.
CudaClipSizes clip_sizes_for(int64_t rows, const MelArgs& a) {
  CudaBufferSizes sizes;
  sizes.frame_rows = rows;
  return cuda_clip_sizes(sizes, a.n_fft, a.hop());
}

ClipFraming framing_of(const MelArgs& a) {
  return ClipFraming{a.n_fft, a.hop(), a.pad(), a.center && a.pad_mode == PadMode::reflect};
}

/// clip_shape_reflect's parameters with `hop`.
MelArgs reflect_hop(int hop) {
  MelArgs a = test::clip_shape_reflect().mel;
  a.hop_length = hop;
  return a;
}

}  // namespace

TEST_CASE("cuda_clip_sizes: a launch of `rows` frames always fits its input budget", "[mel][cuda_host]") {
  const MelArgs a = clip_shape_reflect().mel;
  CudaBufferSizes sizes;
  sizes.frame_rows = 100;
  sizes.input_floats = 10;
  const CudaClipSizes c = cuda_clip_sizes(sizes, a.n_fft, a.hop());
  CHECK(c.rows == 100);
  CHECK(c.input_floats == 99 * 16 + 64 + 2);
  CHECK(c.staging_input_floats == c.input_floats);
  CHECK(c.pieces == 100);
  CHECK(c.extra_slot_bytes(sizes) == (c.input_floats - 10) * 4 + 100 * 48 + 16);
  sizes.input_floats = 100000;
  CHECK(cuda_clip_sizes(sizes, a.n_fft, a.hop()).staging_input_floats == 100000);
  CHECK(sizeof(ClipPiece) == 48);
  int64_t lo = 0, hi = 0;
  piece_sample_range(0, 100, int64_t{1} << 40, framing_of(a), lo, hi);
  CHECK(hi - lo <= c.input_floats);
}

TEST_CASE("piece_sample_range holds every sample a piece's frames read, reflections included", "[mel][cuda_host]") {
  const MelArgs a = GENERATE(clip_shape_reflect().mel, clip_shape_odd().mel, reflect_hop(100), clip_shape_constant().mel,
                             clip_shape_no_center().mel);
  const ClipFraming f = framing_of(a);
  CAPTURE(a.to_string());
  int64_t outside = 0, too_long = 0, reads = 0;
  for (int64_t len = 0; len <= 300; ++len) {
    const int64_t frames = clip_frames(len, f.n_fft, f.hop, f.pad);
    const bool reflect = clip_reflects(len, f.pad, f.reflect);
    for (int64_t t0 = 0; t0 < frames; ++t0) {
      for (const int64_t k : {int64_t{1}, int64_t{2}, frames - t0}) {
        if (k < 1 || t0 + k > frames) continue;
        int64_t lo = 0, hi = 0;
        piece_sample_range(t0, k, len, f, lo, hi);
        too_long += hi - lo > (k - 1) * f.hop + f.n_fft + 2 ? 1 : 0;
        for (int64_t t = t0; t < t0 + k; ++t) {
          for (int n = 0; n < f.n_fft; ++n) {
            const int64_t j = t * f.hop - f.pad + n;
            if ((j < 0 || j >= len) && !reflect) continue;
            const int64_t idx = j >= 0 && j < len ? j : reflect_index(j, len);
            ++reads;
            outside += idx < lo || idx >= hi ? 1 : 0;
          }
        }
      }
    }
  }
  CHECK(reads > 0);
  CHECK(outside == 0);
  CHECK(too_long == 0);
}

TEST_CASE("fill_clip_launch places every frame once, in order, within the launch's budgets", "[mel][cuda_host]") {
  const MelArgs a = GENERATE(clip_shape_reflect().mel, clip_shape_constant().mel, clip_shape_no_center().mel);
  const int64_t rows = GENERATE(1, 2, 7, 64);
  std::vector<int64_t> lengths = kClipLengths;
  lengths.insert(lengths.end(), 40, 63);
  const std::vector<int64_t> offsets = clip_offsets(lengths, 11);
  const std::vector<float> signal = clip_signal(offsets.back(), 3);
  const ClipBatch batch = plan_clips(a, DType::float32, offsets);
  const CudaClipSizes sizes = clip_sizes_for(rows, a);
  const ClipFraming framing = framing_of(a);
  CAPTURE(a.to_string(), rows);

  std::vector<ClipPiece> pieces(static_cast<size_t>(sizes.pieces));
  std::vector<float> input(static_cast<size_t>(sizes.staging_input_floats));
  ClipCursor cursor;
  int64_t next_clip = 0, next_frame = 0, launches = 0, placed = 0;
  while (placed < batch.total_frames()) {
    ClipLaunchHeader header;
    const ClipLaunchFill fill =
        fill_clip_launch(batch, signal.data(), sizes, framing, cursor, header, pieces.data(), input.data());
    ++launches;
    REQUIRE(fill.rows >= 1);
    REQUIRE(fill.rows <= sizes.rows);
    REQUIRE(fill.pieces <= sizes.pieces);
    REQUIRE(fill.input_floats <= sizes.input_floats);
    REQUIRE(header.pieces == fill.pieces);
    REQUIRE(header.rows == fill.rows);
    int64_t row = 0, in = 0;
    for (int64_t p = 0; p < fill.pieces; ++p) {
      const ClipPiece& c = pieces[static_cast<size_t>(p)];
      REQUIRE(c.row == row);
      REQUIRE(c.input == in);
      REQUIRE(c.frame == next_frame);
      REQUIRE(c.samples == batch.samples(next_clip));
      REQUIRE(c.reflect == (clip_reflects(c.samples, a.pad(), framing.reflect) ? 1 : 0));
      const int64_t end_row = p + 1 < fill.pieces ? pieces[static_cast<size_t>(p + 1)].row : fill.rows;
      const int64_t k = end_row - row;
      REQUIRE(k >= 1);
      int64_t lo = 0, hi = 0;
      piece_sample_range(c.frame, k, c.samples, framing, lo, hi);
      REQUIRE(c.origin == lo);
      const float* src = signal.data() + batch.sample_offsets[static_cast<size_t>(next_clip)] + lo;
      REQUIRE(std::equal(src, src + (hi - lo), input.begin() + in));
      next_frame += k;
      REQUIRE(next_frame <= batch.frames(next_clip));
      if (next_frame == batch.frames(next_clip)) {
        ++next_clip;
        next_frame = 0;
      }
      row = end_row;
      in += hi - lo;
    }
    REQUIRE(in == fill.input_floats);
    REQUIRE(cursor.clip == next_clip);
    REQUIRE(cursor.frame == next_frame);
    placed += fill.rows;
  }
  CHECK(placed == batch.total_frames());
  CHECK(cursor.clip == batch.clips());
  CHECK(launches >= (batch.total_frames() + rows - 1) / rows);
  ClipLaunchHeader header;
  CHECK(fill_clip_launch(batch, signal.data(), sizes, framing, cursor, header, pieces.data(), input.data()).rows == 0);
}

TEST_CASE("clip_graph_problem wants the three kernels and no event record", "[mel][cuda_host]") {
  GraphNodeSummary s;
  s.kernels = 3;
  s.child_graphs = 1;
  CHECK(clip_graph_problem(s).empty());
  s.copies = 2;
  CHECK(clip_graph_problem(s).empty());
  s.kernels = 2;
  CHECK_THAT(clip_graph_problem(s), Catch::Contains("2 kernels") && Catch::Contains("expected >= 3"));
  s.kernels = 4;
  s.events = 4;
  CHECK_THAT(clip_graph_problem(s), Catch::Contains("4 event records"));
}

#if defined(MELFORGE_HAVE_CUDA)

namespace {

/// The CUDA engine's compute_clips flow with the kernel bodies in place of the kernels: launches of
/// cuda_clip_sizes rows filled by fill_clip_launch, the exact grids, a naive DFT for cuFFT. Every input sample not
/// uploaded for the launch (and a guard of n_fft samples on each side) and every frame element is NaN before each
/// launch, so a read outside a piece's samples or a frame element left unwritten turns the output NaN. Returns the
/// output [F][n_mels] bytes and counts the launches in `launches`.
std::vector<unsigned char> run_clip_bodies(const EngineConfig& config, const std::vector<float>& signal,
                                           const ClipBatch& batch, int64_t& launches) {
  const MelLayout layout = make_layout(config);
  const auto fb = cached_filterbank(config.mel);
  const CudaBufferSizes sizes = cuda_buffer_sizes(layout, config.mel.n_fft, config.device_batch, fb->nnz());
  const CudaClipSizes clip = cuda_clip_sizes(sizes, config.mel.n_fft, config.mel.hop());
  const std::vector<float> window = window_table(config.mel);
  const std::vector<int32_t> bands = filterbank_band_table(*fb);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t guard = config.mel.n_fft;
  std::vector<float> staging(static_cast<size_t>(clip.staging_input_floats + 2 * guard));
  float* input = staging.data() + guard;
  std::vector<ClipPiece> pieces(static_cast<size_t>(clip.pieces));
  ClipLaunchHeader header;
  std::vector<float> frames(static_cast<size_t>(sizes.frame_floats));
  std::vector<float2> spectrum(static_cast<size_t>(sizes.spectrum_complex));
  std::vector<unsigned char> launch_out(static_cast<size_t>(sizes.output_bytes()));

  const MelArgs& a = config.mel;
  const ClipGatherParams g{input,     &header, pieces.data(), window.data(), frames.data(),
                           clip.rows, a.n_fft, a.hop(),       a.pad()};
  MelParams m;
  m.spectrum = spectrum.data();
  m.bands = bands.data();
  m.weights = fb->weights.data();
  m.out = launch_out.data();
  m.total = clip.rows * layout.n_mels;
  m.n_mels = layout.n_mels;
  m.n_freqs = layout.n_freqs;
  m.power = a.power;
  m.log_mode = static_cast<int>(a.log);
  m.amin = a.amin;
  m.log_eps = a.log_eps;
  m.fp16 = config.dtype == DType::float16;
  REQUIRE(m.total == sizes.output_elems);

  std::vector<unsigned char> out(static_cast<size_t>(batch.out_bytes()));
  const int64_t row_bytes = static_cast<int64_t>(layout.n_mels) * layout.out_elem_bytes;
  ClipCursor cursor;
  launches = 0;
  for (int64_t row = 0; row < batch.total_frames(); ++launches) {
    std::fill(staging.begin(), staging.end(), nan);
    std::fill(frames.begin(), frames.end(), nan);
    const ClipLaunchFill fill =
        fill_clip_launch(batch, signal.data(), clip, framing_of(a), cursor, header, pieces.data(), input);
    REQUIRE(fill.rows >= 1);
    for (int64_t block = 0; block < gather_grid(clip.rows); ++block) {
      for (int thread = 0; thread < kGatherBlock; ++thread) gather_clip_frame(g, block, thread, kGatherBlock);
    }
    for (int64_t i = 0; i < clip.rows * a.n_fft; ++i) REQUIRE(std::isfinite(frames[static_cast<size_t>(i)]));
    test::naive_rfft(frames, a.n_fft, clip.rows, spectrum);
    for (int64_t block = 0; block < mel_grid(m.total); ++block) {
      for (int thread = 0; thread < kMelBlock; ++thread) mel_frame_element(m, block, thread, kMelBlock);
    }
    std::memcpy(out.data() + row * row_bytes, launch_out.data(), static_cast<size_t>(fill.rows * row_bytes));
    row += fill.rows;
  }
  return out;
}

}  // namespace

TEST_CASE("clip kernel bodies on the kernel grid match the CPU engine's compute_clips", "[mel][cuda_bodies]") {
  const ClipShape s = GENERATE(clip_shape_reflect(), clip_shape_constant(), clip_shape_no_center(), clip_shape_odd(),
                               clip_shape_short_launches());
  const DType dtype = GENERATE(DType::float32, DType::float16);
  const bool many_short = GENERATE(false, true);
  CAPTURE(s.name, to_string(dtype), many_short);
  const EngineConfig config = config_of(s, dtype);
  const std::vector<int64_t> lengths = many_short ? std::vector<int64_t>(60, 63) : kClipLengths;
  const std::vector<int64_t> offsets = clip_offsets(lengths, 2);
  const std::vector<float> signal = clip_signal(offsets.back() + 2, 5);
  const ClipBatch batch = plan_clips(s.mel, dtype, offsets);
  int64_t launches = 0;
  const std::vector<unsigned char> bodies = run_clip_bodies(config, signal, batch, launches);
  const int64_t rows = s.device_batch * make_layout(config).n_frames;
  CHECK(launches >= (batch.total_frames() + rows - 1) / rows);
  auto cpu = make_cpu_engine(config);
  std::vector<unsigned char> want(static_cast<size_t>(batch.out_bytes()));
  cpu->compute_clips(signal.data(), batch, want.data());
  test::check_clips_close(bodies, want, batch, s.mel);
}

TEST_CASE("clip gather body: rows past the launch's frames are zero frames", "[mel][cuda_bodies]") {
  const MelArgs a = clip_shape_reflect().mel;
  const std::vector<float> signal = clip_signal(100, 1);
  const ClipBatch batch = plan_clips(a, DType::float32, std::vector<int64_t>{0, 100});
  const CudaClipSizes sizes = clip_sizes_for(10, a);
  std::vector<ClipPiece> pieces(static_cast<size_t>(sizes.pieces));
  std::vector<float> input(static_cast<size_t>(sizes.staging_input_floats));
  ClipLaunchHeader header;
  ClipCursor cursor;
  const ClipLaunchFill fill =
      fill_clip_launch(batch, signal.data(), sizes, framing_of(a), cursor, header, pieces.data(), input.data());
  REQUIRE(fill.rows == 7);
  std::vector<float> window(64, 1.0f);
  std::vector<float> frames(static_cast<size_t>(sizes.rows * 64), std::numeric_limits<float>::quiet_NaN());
  const ClipGatherParams g{input.data(), &header, pieces.data(), window.data(), frames.data(), sizes.rows, 64, 16, 32};
  for (int64_t block = 0; block < sizes.rows + 3; ++block) {
    for (int thread = 0; thread < kGatherBlock; ++thread) gather_clip_frame(g, block, thread, kGatherBlock);
  }
  for (int64_t r = 0; r < sizes.rows; ++r) {
    for (int n = 0; n < 64; ++n) {
      const float want = r < 7 ? padded_sample(signal.data(), 100, r * 16 + n, 32, true) : 0.0f;
      REQUIRE(frames[static_cast<size_t>(r * 64 + n)] == want);
    }
  }
}

#endif  // MELFORGE_HAVE_CUDA

}  // namespace melforge_test_mel_ragged_bodies
