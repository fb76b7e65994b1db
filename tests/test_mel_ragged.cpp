// Whole clips of any lengths (MelEngine::compute_clips) on the CPU engine: the frame-count rule against an independent
// count, plan_clips, each clip of a ragged batch against the naive reference and against the segment path, the
// frames of a clip independent of its neighbours, and torchaudio's MelSpectrogram of whole clips (fixtures).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mel/half.h"
#include "mel/mel_engine.h"
#include "mel/mel_math.h"
#include "mel_clips.h"
#include "mel_fixtures.h"
#include "mel_reference.h"
#include "melforge/common/errors.h"

namespace melforge_test_mel_ragged {

using namespace melforge;
using namespace melforge::mel;
using test::clip_offsets;
using test::clip_reference;
using test::clip_shape_constant;
using test::clip_shape_no_center;
using test::clip_shape_odd;
using test::clip_shape_reflect;
using test::clip_signal;
using test::clip_view;
using test::ClipShape;
using test::config_of;
using test::kClipLengths;

namespace {

/// compute_clips of a fresh engine of `config` over clips `offsets` of `signal`; every output byte preset to 0xff
/// (a NaN for either dtype), so that an element left unwritten shows.
std::vector<unsigned char> run_clips(const EngineConfig& config, const std::vector<float>& signal,
                                     const ClipBatch& batch) {
  auto engine = make_cpu_engine(config);
  std::vector<unsigned char> out(static_cast<size_t>(batch.out_bytes()), 0xff);
  engine->compute_clips(signal.data(), batch, out.data());
  return out;
}

/// Frames of an independent count: how many t >= 0 have t*hop + n_fft <= samples + 2*pad.
int64_t enumerated_frames(int64_t samples, int n_fft, int hop, int pad) {
  int64_t frames = 0;
  while (frames * hop + n_fft <= samples + 2 * pad) ++frames;
  return frames;
}

}  // namespace

TEST_CASE("clip_frames is torch.stft's frame count, and 1 for a clip too short for any", "[mel][mel_ragged]") {
  CHECK(stft_frames(4800, 512, 256, 256) == 19);
  CHECK(stft_frames(21920, 512, 256, 256) == 86);
  CHECK(stft_frames(64160, 400, 160, 0) == 399);
  CHECK(stft_frames(399, 400, 160, 0) == 0);
  CHECK(clip_frames(399, 400, 160, 0) == 1);
  CHECK(stft_frames(0, 5, 2, 2) == 0);
  CHECK(clip_frames(0, 5, 2, 2) == 1);
  CHECK(stft_frames(int64_t{1} << 40, 512, 256, 256) == (int64_t{1} << 32) + 1);
  for (const int n_fft : {2, 5, 8, 63, 64}) {
    for (const int hop : {1, 3, 16, 64, 100}) {
      for (const bool center : {true, false}) {
        const int pad = center ? n_fft / 2 : 0;
        for (int64_t samples = 0; samples <= 300; ++samples) {
          const int64_t want = enumerated_frames(samples, n_fft, hop, pad);
          REQUIRE(stft_frames(samples, n_fft, hop, pad) == want);
          REQUIRE(clip_frames(samples, n_fft, hop, pad) == std::max<int64_t>(want, 1));
          REQUIRE(frame_count(samples, n_fft, hop, pad) == want);
        }
      }
    }
  }
}

TEST_CASE("plan_clips: frame offsets, flags, output size and errors", "[mel][mel_ragged]") {
  MelArgs a;
  a.n_fft = 512;
  a.hop_length = 256;
  const std::vector<int64_t> offsets = clip_offsets({4800, 0, 256, 257, 511}, 7);
  SECTION("center reflect: short clips get zero edges, an empty clip one padded frame") {
    const ClipBatch b = plan_clips(a, DType::float16, offsets);
    REQUIRE(b.clips() == 5);
    CHECK(b.frame_offsets == std::vector<int64_t>{0, 19, 20, 22, 24, 26});
    CHECK(b.flags == std::vector<uint8_t>{0, kClipPaddedToFrame | kClipZeroEdges, kClipZeroEdges, 0, 0});
    CHECK(b.samples(0) == 4800);
    CHECK(b.frames(0) == 19);
    CHECK(b.total_frames() == 26);
    CHECK(b.out_bytes() == 26 * 64 * 2);
    const ClipBatch tail = b.slice(2, 5);
    CHECK(tail.sample_offsets == std::vector<int64_t>(offsets.begin() + 2, offsets.end()));
    CHECK(tail.frame_offsets == std::vector<int64_t>{0, 2, 4, 6});
    CHECK(tail.flags == std::vector<uint8_t>{kClipZeroEdges, 0, 0});
    CHECK(b.slice(5, 5).clips() == 0);
    CHECK_THROWS_AS(b.slice(3, 2), InvalidArgument);
    CHECK_THROWS_AS(b.slice(0, 6), InvalidArgument);
  }
  SECTION("center constant: only the empty clip is flagged") {
    a.pad_mode = PadMode::constant;
    const ClipBatch b = plan_clips(a, DType::float32, offsets);
    CHECK(b.frame_offsets == std::vector<int64_t>{0, 19, 20, 22, 24, 26});
    CHECK(b.flags == std::vector<uint8_t>{0, kClipPaddedToFrame, 0, 0, 0});
    CHECK(b.out_bytes() == 26 * 64 * 4);
  }
  SECTION("no center: clips shorter than n_fft are padded to one frame") {
    a.center = false;
    const ClipBatch b = plan_clips(a, DType::float32, offsets);
    CHECK(b.frame_offsets == std::vector<int64_t>{0, 17, 18, 19, 20, 21});
    CHECK(b.flags ==
          std::vector<uint8_t>{0, kClipPaddedToFrame, kClipPaddedToFrame, kClipPaddedToFrame, kClipPaddedToFrame});
  }
  SECTION("no clip") {
    const ClipBatch b = plan_clips(a, DType::float32, std::vector<int64_t>{12});
    CHECK(b.clips() == 0);
    CHECK(b.total_frames() == 0);
    CHECK(b.out_bytes() == 0);
  }
  SECTION("bad offsets and arguments") {
    CHECK_THROWS_AS(plan_clips(a, DType::float32, std::vector<int64_t>{}), InvalidArgument);
    CHECK_THROWS_AS(plan_clips(a, DType::float32, std::vector<int64_t>{-1, 10}), InvalidArgument);
    CHECK_THROWS_WITH(plan_clips(a, DType::float32, std::vector<int64_t>{0, 10, 9}),
                      Catch::Contains("must not decrease"));
    a.n_mels = 0;
    CHECK_THROWS_AS(plan_clips(a, DType::float32, offsets), InvalidArgument);
  }
}

TEST_CASE("compute_clips refuses a batch planned for other parameters", "[mel][mel_ragged]") {
  const ClipShape s = clip_shape_reflect();
  auto engine = make_cpu_engine(config_of(s));
  const std::vector<float> signal = clip_signal(1000, 1);
  const std::vector<int64_t> offsets = {0, 100, 1000};
  std::vector<unsigned char> out(1 << 16);
  MelArgs other = s.mel;
  other.hop_length = 17;
  CHECK_THROWS_AS(engine->compute_clips(signal.data(), plan_clips(other, DType::float32, offsets), out.data()),
                  InvalidArgument);
  CHECK_THROWS_AS(engine->compute_clips(signal.data(), plan_clips(s.mel, DType::float16, offsets), out.data()),
                  InvalidArgument);
  ClipBatch edited = plan_clips(s.mel, DType::float32, offsets);
  edited.frame_offsets[1] += 1;
  CHECK_THROWS_AS(engine->compute_clips(signal.data(), edited, out.data()), InvalidArgument);
  CHECK_THROWS_AS(engine->compute_clips(signal.data(), plan_clips(s.mel, DType::float32, offsets), nullptr),
                  InvalidArgument);
  engine->compute_clips(nullptr, plan_clips(s.mel, DType::float32, std::vector<int64_t>{0}), nullptr);
}

TEST_CASE("CPU compute_clips matches the naive reference clip by clip", "[mel][mel_ragged]") {
  const ClipShape s = GENERATE(clip_shape_reflect(), clip_shape_constant(), clip_shape_no_center(), clip_shape_odd());
  const int threads = GENERATE(1, 3);
  CAPTURE(s.name, threads);
  const std::vector<int64_t> offsets = clip_offsets(kClipLengths, 3);
  const std::vector<float> signal = clip_signal(offsets.back() + 5, 7);
  const ClipBatch batch = plan_clips(s.mel, DType::float32, offsets);
  const std::vector<unsigned char> out = run_clips(config_of(s, DType::float32, threads), signal, batch);
  const auto fb = test::reference_filterbank(s.mel);
  for (int64_t c = 0; c < batch.clips(); ++c) {
    const std::vector<float> got = clip_view(out, batch, c);
    for (const float v : got) REQUIRE(std::isfinite(v));
    const auto want = clip_reference(s.mel, signal.data() + offsets[c], batch.samples(c), batch.flags[c], fb);
    REQUIRE(static_cast<int64_t>(want.size()) == batch.frames(c) * batch.n_mels);
    const auto cmp =
        test::compare_log_mel(got.data(), want.data(), batch.n_mels, static_cast<int>(batch.frames(c)), s.mel);
    INFO("clip " << c << " of " << batch.samples(c) << " samples, flags " << int{batch.flags[c]} << ": worst error / "
                 << "tolerance " << cmp.worst_ratio << " at " << cmp.worst_index);
    CHECK(cmp.failures == 0);
  }
}

// Bitwise for the clips around it (one FFTW plan, the same block of frames whatever rows they take); within the
// tolerance for the segment path, whose plan has another batch size (FFTW_ESTIMATE may then round differently).
TEST_CASE("a clip's frames do not depend on the clips around it or on the segment path", "[mel][mel_ragged]") {
  const ClipShape s = GENERATE(clip_shape_reflect(), clip_shape_constant(), clip_shape_no_center(), clip_shape_odd());
  const std::vector<int64_t> offsets = clip_offsets(kClipLengths, 0);
  const std::vector<float> signal = clip_signal(offsets.back(), 9);
  const ClipBatch batch = plan_clips(s.mel, DType::float32, offsets);
  const std::vector<unsigned char> together = run_clips(config_of(s), signal, batch);
  for (int64_t c = 0; c < batch.clips(); ++c) {
    const int64_t len = batch.samples(c);
    CAPTURE(s.name, c, len);
    std::vector<float> alone(signal.begin() + offsets[c], signal.begin() + offsets[c + 1]);
    alone.insert(alone.begin(), 5, 1e6f);
    alone.insert(alone.end(), 5, -1e6f);
    const ClipBatch one = plan_clips(s.mel, DType::float32, std::vector<int64_t>{5, 5 + len});
    const std::vector<float> single = clip_view(run_clips(config_of(s), alone, one), one, 0);
    CHECK(single == clip_view(together, batch, c));
    if (batch.flags[c] != 0) continue;
    EngineConfig seg = config_of(s, DType::float32, 1);
    seg.segment_samples = len;
    auto engine = make_cpu_engine(seg);
    std::vector<float> segment(static_cast<size_t>(engine->layout().out_elems_per_segment()));
    engine->compute(alone.data(), std::vector<int64_t>{5}, segment.data());
    const auto cmp =
        test::compare_log_mel(segment.data(), single.data(), batch.n_mels, static_cast<int>(batch.frames(c)), s.mel);
    INFO("segment path vs clip: worst error / tolerance " << cmp.worst_ratio);
    CHECK(cmp.failures == 0);
  }
}

TEST_CASE("positive controls: a shifted clip, a frame off by one and swapped clips fail the comparison",
          "[mel][mel_ragged]") {
  const ClipShape s = clip_shape_reflect();
  const std::vector<int64_t> offsets = clip_offsets({700, 700, 257}, 1);
  const std::vector<float> signal = clip_signal(offsets.back() + 1, 13);
  const ClipBatch batch = plan_clips(s.mel, DType::float32, offsets);
  const std::vector<unsigned char> out = run_clips(config_of(s), signal, batch);
  const auto fb = test::reference_filterbank(s.mel);
  const int frames = static_cast<int>(batch.frames(0));
  const std::vector<float> clip0 = clip_view(out, batch, 0);
  const auto ref0 = clip_reference(s.mel, signal.data() + offsets[0], 700, 0, fb);
  REQUIRE(test::compare_log_mel(clip0.data(), ref0.data(), batch.n_mels, frames, s.mel).failures == 0);
  const auto shifted = clip_reference(s.mel, signal.data() + offsets[0] + 1, 700, 0, fb);
  CHECK(test::compare_log_mel(clip0.data(), shifted.data(), batch.n_mels, frames, s.mel).failures > 0);
  const auto other = clip_reference(s.mel, signal.data() + offsets[1], 700, 0, fb);
  CHECK(test::compare_log_mel(clip0.data(), other.data(), batch.n_mels, frames, s.mel).failures > 0);
  std::vector<float> late(clip0.size());
  for (int m = 0; m < batch.n_mels; ++m) {
    for (int t = 0; t < frames; ++t) late[m * frames + t] = clip0[m * frames + std::max(t - 1, 0)];
  }
  CHECK(test::compare_log_mel(late.data(), ref0.data(), batch.n_mels, frames, s.mel).failures > 0);
  const auto reflected = clip_reference(s.mel, signal.data() + offsets[0], 700, kClipZeroEdges, fb);
  CHECK(test::compare_log_mel(clip0.data(), reflected.data(), batch.n_mels, frames, s.mel).failures > 0);
}

TEST_CASE("CPU compute_clips: float16 is float32 rounded, threads change nothing, silence is silence_value",
          "[mel][mel_ragged]") {
  const ClipShape s = GENERATE(clip_shape_reflect(), clip_shape_no_center());
  const std::vector<int64_t> offsets = clip_offsets(kClipLengths, 0);
  const std::vector<float> signal = clip_signal(offsets.back(), 21);
  const ClipBatch f32 = plan_clips(s.mel, DType::float32, offsets);
  const ClipBatch f16 = plan_clips(s.mel, DType::float16, offsets);
  const std::vector<unsigned char> one = run_clips(config_of(s, DType::float32, 1), signal, f32);
  for (const int threads : {2, 5, 16}) {
    CAPTURE(threads);
    CHECK(run_clips(config_of(s, DType::float32, threads), signal, f32) == one);
  }
  const std::vector<unsigned char> half = run_clips(config_of(s, DType::float16, 3), signal, f16);
  REQUIRE(half.size() * 2 == one.size());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < f32.out_elems(); ++i) {
    uint16_t h = 0;
    std::memcpy(&h, half.data() + i * 2, 2);
    mismatches += h != float_to_half_bits(test::element(one, i, 4)) ? 1 : 0;
  }
  CHECK(mismatches == 0);

  const std::vector<float> zeros(static_cast<size_t>(offsets.back()), 0.0f);
  const std::vector<unsigned char> silent = run_clips(config_of(s), zeros, f32);
  for (int64_t i = 0; i < f32.out_elems(); ++i) REQUIRE(test::element(silent, i, 4) == silence_value(s.mel));
}

TEST_CASE("CPU compute_clips matches torchaudio's MelSpectrogram of whole clips", "[mel][mel_ragged]") {
  const test::ClipFixtures f = test::load_clip_fixtures();
  for (const auto& set : f.manifest.at("sets")) {
    ClipShape s{set.at("name"), test::mel_args_from_json(set.at("params")), 4000, 1};
    const ClipBatch batch = plan_clips(s.mel, DType::float32, f.offsets);
    test::check_clip_fixture(run_clips(config_of(s), f.signal, batch), batch, set);
  }
}

}  // namespace melforge_test_mel_ragged
