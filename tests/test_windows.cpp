// kernels/windows: predict's whole-file windows. The plan against a naive enumeration, the streamed decode against
// decode() of the whole file, the streamed windows against windows cut from the whole decoded file, and the windows
// at the builder's hop against the spectrograms a dataset stores for the same files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <span>

#include "audio/decode.h"
#include "build_fixture.h"
#include "featurize/featurize.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"
#include "windows/windows.h"

namespace melforge_test_windows {

using namespace melforge;
using melforge::test::TempDir;

namespace {

/// Naive window starts and audio lengths of a file of `frames` samples (the rule of windows.h, written out).
std::vector<std::pair<int64_t, int64_t>> naive_windows(int64_t frames, int64_t L, int64_t S, int64_t hop, bool pad) {
  std::vector<std::pair<int64_t, int64_t>> w;
  if (frames < L) {
    if (pad && frames >= S) w.emplace_back(0, frames);
    return w;
  }
  int64_t s = 0;
  for (; s + L <= frames; s += hop) w.emplace_back(s, L);
  const int64_t covered = w.back().first + L;
  if (covered < frames && pad && frames - s >= S) w.emplace_back(s, frames - s);
  return w;
}

/// The parameters of a segment-layout dataset of the tone build (tone_build_config's spectrogram, long segments of
/// 1 s cut into 4 short ones of 0.25 s, float32): what predict's windows reproduce.
featurize::DatasetParams tone_params() {
  featurize::DatasetParams p;
  p.mel = test::tone_build_config("in", "out").mel;
  p.segment.long_seconds = 1.0;
  p.segment.short_seconds = 0.25;
  p.dtype = mel::DType::float32;
  p.num_long = 1;
  p.num_short = 4;
  p.n_mels = 32;
  p.n_frames = 1 + 2000 / 64;
  p.long_samples = 8000;
  p.short_samples = 2000;
  return p;
}

}  // namespace

TEST_CASE("plan_windows places windows every hop and keeps a last partial one by the short_files policy",
          "[windows]") {
  const int64_t frames = GENERATE(1, 1999, 2000, 7999, 8000, 8001, 8499, 8500, 8501, 9999, 12345);
  const double hop_s = GENERATE(0.0, 0.25, 0.3, 1.0);
  const bool pad = GENERATE(true, false);
  CAPTURE(frames, hop_s, pad);
  segment::SegmentArgs a;
  a.long_seconds = 1.0;
  a.short_seconds = 0.25;
  a.short_files = pad ? segment::ShortFilePolicy::pad : segment::ShortFilePolicy::skip;
  const int64_t hop = windows::hop_samples(hop_s, a, 8000);
  CHECK(hop == (hop_s == 0 ? 8000 : std::llround(hop_s * 8000)));
  const windows::WindowPlan p = windows::plan_windows(frames, a, 8000, hop);
  const auto want = naive_windows(frames, 8000, 2000, hop, pad);
  REQUIRE(p.count == static_cast<int64_t>(want.size()));
  CHECK(p.skip_reason.empty() == !want.empty());
  for (int64_t k = 0; k < p.count; ++k) {
    CHECK(p.start(k) == want[static_cast<std::size_t>(k)].first);
    CHECK(p.audio_samples(k) == want[static_cast<std::size_t>(k)].second);
  }
}

TEST_CASE("hop_samples refuses a hop beyond the window, negative or below one sample", "[windows]") {
  segment::SegmentArgs a;
  a.long_seconds = 1.0;
  CHECK_THROWS_WITH(windows::hop_samples(1.5, a, 8000), Catch::Contains("--hop") && Catch::Contains("gaps"));
  CHECK_THROWS_AS(windows::hop_samples(-1, a, 8000), InvalidArgument);
  CHECK_THROWS_AS(windows::hop_samples(NAN, a, 8000), InvalidArgument);
  CHECK_THROWS_AS(windows::hop_samples(1e-6, a, 8000), InvalidArgument);
  CHECK(windows::hop_samples(1.0, a, 8000) == 8000);
}

TEST_CASE("DecodeStream gives decode()'s samples whatever the read sizes", "[windows][decode]") {
  const int rate = GENERATE(8000, 16000, 44100);
  const int channels = GENERATE(1, 2);
  const int64_t piece = GENERATE(1, 777, 65536);
  CAPTURE(rate, channels, piece);
  TempDir d;
  test::write_tone(d / "a.wav", 440, rate * 3 + 17, rate, channels);
  audio::DecodeOptions o;
  o.sample_rate = 8000;
  const audio::DecodedAudio whole = audio::decode(d / "a.wav", o);
  audio::DecodeStream stream(d / "a.wav", o);
  CHECK(stream.info().frames == static_cast<int64_t>(whole.samples.size()));
  CHECK(stream.info().resampled == (rate != 8000));
  std::vector<float> got, buf(static_cast<std::size_t>(piece));
  for (int64_t n; (n = stream.read(buf)) > 0;) got.insert(got.end(), buf.begin(), buf.begin() + n);
  REQUIRE(got.size() == whole.samples.size());
  CHECK(got == whole.samples);
  CHECK(stream.read(buf) == 0);
}

TEST_CASE("DecodeStream reports a truncated file as decode() does", "[windows][decode]") {
  TempDir d;
  test::write_tone(d / "a.flac", 440, 40000, 8000, 1, SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  std::filesystem::resize_file(d / "a.flac", std::filesystem::file_size(d / "a.flac") / 2);
  audio::DecodeStream stream(d / "a.flac", {});
  std::vector<float> buf(4096);
  CHECK_THROWS_WITH([&] { while (stream.read(buf) > 0) {} }(), Catch::Contains("a.flac") && Catch::Contains("truncated"));
}

TEST_CASE("streamed windows equal the windows cut from the whole decoded file", "[windows]") {
  const double hop_s = GENERATE(0.0, 0.3);
  const int64_t batch = GENERATE(1, 3, 64);
  const int rate = GENERATE(8000, 16000);
  CAPTURE(hop_s, batch, rate);
  TempDir d;
  const featurize::DatasetParams p = tone_params();
  test::write_tone(d / "long.wav", 523, rate * 7 + rate / 3, rate, 2);
  featurize::Featurizer f(p, 2);
  const int64_t hop = windows::hop_samples(hop_s, p.segment, p.mel.sample_rate);
  windows::FileWindows fw(f, d / "long.wav", hop, batch);
  const windows::WindowPlan& plan = fw.plan();
  CHECK(plan.count == windows::plan_windows(plan.frames, p.segment, p.mel.sample_rate, hop).count);

  audio::DecodeOptions o;
  o.sample_rate = p.mel.sample_rate;
  o.channel = p.channel;
  const std::vector<float> audio = audio::decode(d / "long.wav", o).samples;
  REQUIRE(static_cast<int64_t>(audio.size()) == plan.frames);
  const int64_t L = p.long_samples, per_window = p.num_short * p.n_mels * p.n_frames;
  std::vector<float> want(static_cast<std::size_t>(plan.count * per_window));
  for (int64_t k = 0; k < plan.count; ++k) {
    std::vector<float> arena(static_cast<std::size_t>(L), 0.0f);
    std::copy_n(audio.begin() + plan.start(k), plan.audio_samples(k), arena.begin());
    std::vector<float> one(static_cast<std::size_t>(per_window));
    for (int64_t s = 0; s < p.num_short; ++s) {
      const int64_t off = s * p.short_samples;
      f.engine().compute(arena.data(), std::span<const int64_t>(&off, 1),
                         reinterpret_cast<uint8_t*>(one.data() + s * p.n_mels * p.n_frames));
    }
    std::copy(one.begin(), one.end(), want.begin() + k * per_window);
  }
  std::vector<float> got;
  windows::WindowBatch b;
  int64_t expect_first = 0;
  while (fw.next(b)) {
    CHECK(b.first == expect_first);
    CHECK(b.count <= batch);
    expect_first += b.count;
    got.insert(got.end(), b.values.begin(), b.values.end());
  }
  REQUIRE(expect_first == plan.count);
  REQUIRE(got.size() == want.size());
  float max_diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  CAPTURE(max_diff);
  CHECK(max_diff <= 1e-5f);
}

}  // namespace melforge_test_windows
