#pragma once
/// Helpers of the whole-clip (ragged) mel tests, shared by the CPU, kernel-body and `[cuda]` test files: test shapes
/// and clip lengths, clip batches to compute, a clip's frames as torchaudio's [n_mels][n_frames], the torchaudio
/// whole-clip fixtures, and the naive reference of one clip under compute_clips' edge rule (kClipZeroEdges: zeros
/// instead of reflection; kClipPaddedToFrame: zero-padded to one frame), written from the flags, not from the
/// engine's code.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mel/mel_args.h"
#include "mel/mel_engine.h"
#include "mel_fixtures.h"
#include "mel_reference.h"

namespace melforge::test {

/// `n` samples of a seeded noisy two-tone signal in about [-1, 1].
inline std::vector<float> clip_signal(int64_t n, unsigned seed) {
  return tone_signal(n, seed, {0.5, 0.031, 0.25, 0.83, 0.4, 0.2f});
}

/// Spectrogram parameters of a clip test, with the segment length and device batch that set the engines' frames
/// per FFT batch: the CPU engine's block (cpu_block_frames of the segment's frames), the CUDA engine's launch
/// (device_batch * the segment's frames).
struct ClipShape {
  std::string name;
  mel::MelArgs mel;
  int64_t segment_samples = 0;
  int64_t device_batch = 1;
};

/// n_fft 64 (pad 32) at 8 kHz, hop 16, 12 bands: the base of the shapes below.
inline ClipShape clip_shape_reflect() {
  ClipShape s{"n_fft 64 hop 16 center reflect; block 26, launches of 2 x 26 rows", {}, 400, 2};
  s.mel.sample_rate = 8000;
  s.mel.n_fft = 64;
  s.mel.hop_length = 16;
  s.mel.n_mels = 12;
  return s;
}

inline ClipShape clip_shape_constant() {
  ClipShape s = clip_shape_reflect();
  s.name = "n_fft 64 win 48 hop 20 hamming center constant ln; block 16, launches of 3 x 16 rows";
  s.mel.win_length = 48;
  s.mel.hop_length = 20;
  s.mel.window = mel::Window::hamming;
  s.mel.pad_mode = mel::PadMode::constant;
  s.mel.n_mels = 10;
  s.mel.log = mel::LogMode::ln;
  s.segment_samples = 300;
  s.device_batch = 3;
  return s;
}

inline ClipShape clip_shape_no_center() {
  ClipShape s = clip_shape_reflect();
  s.name = "n_fft 64 hop 24 no center power 1 slaney; block 19, launches of 1 x 19 rows";
  s.mel.hop_length = 24;
  s.mel.center = false;
  s.mel.power = 1.0f;
  s.mel.n_mels = 16;
  s.mel.mel_scale = mel::MelScale::slaney;
  s.mel.mel_norm = mel::MelNorm::slaney;
  s.segment_samples = 500;
  s.device_batch = 1;
  return s;
}

inline ClipShape clip_shape_odd() {
  ClipShape s = clip_shape_reflect();
  s.name = "n_fft 63 hop 16 center reflect; block 17, launches of 2 x 17 rows";
  s.mel.n_fft = 63;
  s.segment_samples = 257;
  return s;
}

/// Launches of 3 rows: clips split into pieces that hold only an edge frame.
inline ClipShape clip_shape_short_launches() {
  ClipShape s = clip_shape_reflect();
  s.name = "n_fft 64 hop 16 center reflect; block 3, launches of 1 x 3 rows";
  s.segment_samples = 33;
  s.device_batch = 1;
  return s;
}

/// An engine configuration of `s`.
inline mel::EngineConfig config_of(const ClipShape& s, mel::DType dtype = mel::DType::float32, int threads = 2) {
  mel::EngineConfig c;
  c.mel = s.mel;
  c.segment_samples = s.segment_samples;
  c.dtype = dtype;
  c.threads = threads;
  c.device_batch = s.device_batch;
  return c;
}

/// Clip lengths around every edge of the shapes above (pad 31/32, hops 16..24, n_fft 63/64), empty clips, a long
/// clip of many FFT batches, and short ones after it.
inline const std::vector<int64_t> kClipLengths = {1,  0,  2,   15,   16, 31,  32, 33, 63,
                                                  64, 80, 257, 3001, 1,  700, 24, 0,  65};

/// Sample offsets [C + 1] of clips of `lengths` laid end to end from sample `start` on.
inline std::vector<int64_t> clip_offsets(const std::vector<int64_t>& lengths, int64_t start = 0) {
  std::vector<int64_t> offsets = {start};
  for (const int64_t n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}

/// Clip c's frames of a compute_clips output ([F][n_mels]) as [n_mels][frames], torchaudio's layout.
inline std::vector<float> clip_view(const std::vector<unsigned char>& out, const mel::ClipBatch& batch, int64_t c) {
  const int64_t frames = batch.frames(c);
  const int64_t first = batch.frame_offsets[static_cast<size_t>(c)];
  std::vector<float> view(static_cast<size_t>(frames * batch.n_mels));
  for (int64_t t = 0; t < frames; ++t) {
    for (int m = 0; m < batch.n_mels; ++m) {
      view[static_cast<size_t>(m * frames + t)] = element(out, (first + t) * batch.n_mels + m, batch.out_elem_bytes);
    }
  }
  return view;
}

/// Naive log-mel [n_mels][frames] of the `len` samples at `x` as compute_clips defines it for a clip with ClipFlag
/// bits `flags`: reference_log_mel of the clip, with pad_mode constant under kClipZeroEdges, and the clip zero-padded
/// on the right to the shortest length that gives one frame under kClipPaddedToFrame.
inline std::vector<double> clip_reference(const mel::MelArgs& a, const float* x, int64_t len, uint8_t flags,
                                          const std::vector<double>& fb) {
  mel::MelArgs r = a;
  if ((flags & mel::kClipZeroEdges) != 0) r.pad_mode = mel::PadMode::constant;
  std::vector<float> clip(x, x + len);
  if ((flags & mel::kClipPaddedToFrame) != 0) {
    const int64_t one_frame = a.center ? a.n_fft - 2 * (a.n_fft / 2) : a.n_fft;
    if (static_cast<int64_t>(clip.size()) < one_frame) clip.resize(static_cast<size_t>(one_frame), 0.0f);
  }
  return reference_log_mel(r, clip.data(), static_cast<int64_t>(clip.size()), fb);
}

/// Checks, clip by clip, that an engine's compute_clips output `got` agrees with another engine's `want` (same
/// batch): float32 within compare_log_mel's tolerance, float16 within float32 FFT rounding plus half rounding (rel
/// 2e-3 plus 5e-3). Every value must be finite.
inline void check_clips_close(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                              const mel::ClipBatch& batch, const mel::MelArgs& a) {
  REQUIRE(got.size() == want.size());
  for (int64_t c = 0; c < batch.clips(); ++c) {
    const std::vector<float> x = clip_view(got, batch, c);
    const std::vector<float> y = clip_view(want, batch, c);
    CAPTURE(c, batch.samples(c), batch.frames(c));
    for (const float v : x) REQUIRE(std::isfinite(v));
    if (batch.out_elem_bytes == 4) {
      const auto cmp = compare_log_mel(x.data(), y.data(), batch.n_mels, static_cast<int>(batch.frames(c)), a);
      INFO("worst error / tolerance " << cmp.worst_ratio << " at " << cmp.worst_index);
      CHECK(cmp.failures == 0);
      continue;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("element " << i << ": " << x[i] << ", want " << y[i]);
      REQUIRE(std::abs(x[i] - y[i]) <= 2e-3 * std::abs(y[i]) + 5e-3);
    }
  }
}

/// The whole-clip torchaudio fixtures (tests/data/mel/manifest_clips.json): the clips laid end to end.
struct ClipFixtures {
  /// The parsed manifest: "clips" and "sets".
  nlohmann::json manifest;
  /// Every clip's samples, one after another.
  std::vector<float> signal;
  /// [C + 1] sample offsets of the clips in `signal`.
  std::vector<int64_t> offsets;
};

/// Loads manifest_clips.json and its clips.
inline ClipFixtures load_clip_fixtures() {
  std::ifstream in(mel_fixture_dir() / "manifest_clips.json");
  REQUIRE(in);
  ClipFixtures f;
  f.manifest = nlohmann::json::parse(in);
  f.offsets = {0};
  for (const auto& clip : f.manifest.at("clips")) {
    const auto x = load_f32(clip.at("file"), clip.at("samples").get<int64_t>());
    f.signal.insert(f.signal.end(), x.begin(), x.end());
    f.offsets.push_back(static_cast<int64_t>(f.signal.size()));
  }
  REQUIRE(f.manifest.at("sets").size() >= 2);
  return f;
}

/// Checks a float32 compute_clips output of the fixtures' clips (`batch`, planned with the set's params) against
/// torchaudio's set `set`, clip by clip within compare_log_mel's tolerance; as a positive control, the log floor
/// (silence_value) must fail every clip.
inline void check_clip_fixture(const std::vector<unsigned char>& out, const mel::ClipBatch& batch,
                               const nlohmann::json& set) {
  const mel::MelArgs a = mel_args_from_json(set.at("params"));
  const auto frames = set.at("n_frames").get<std::vector<int64_t>>();
  const int n_mels = set.at("n_mels");
  const std::string name = set.at("name");
  REQUIRE(batch.clips() == static_cast<int64_t>(frames.size()));
  const auto want = load_f32(set.at("file"), batch.total_frames() * n_mels);
  int64_t at = 0;
  for (int64_t c = 0; c < batch.clips(); ++c) {
    CAPTURE(name, c, batch.samples(c));
    REQUIRE(batch.frames(c) == frames[static_cast<size_t>(c)]);
    REQUIRE(batch.flags[static_cast<size_t>(c)] == 0);
    const std::vector<float> got = clip_view(out, batch, c);
    const int n_frames = static_cast<int>(batch.frames(c));
    const auto cmp = compare_log_mel(got.data(), want.data() + at, n_mels, n_frames, a);
    INFO("worst error / tolerance " << cmp.worst_ratio << " at " << cmp.worst_index);
    CHECK(cmp.failures == 0);
    const std::vector<float> floor(got.size(), mel::silence_value(a));
    CHECK(compare_log_mel(floor.data(), want.data() + at, n_mels, n_frames, a).failures > 0);
    at += batch.frames(c) * n_mels;
  }
}

}  // namespace melforge::test
