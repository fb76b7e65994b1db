// The mel filterbank against torchaudio's melscale_fbanks (fixtures), against the formulas in double, its sparse
// storage, its cache, and the parameter checks of MelArgs::validate.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mel/filterbank.h"
#include "mel/mel_args.h"
#include "mel_fixtures.h"
#include "mel_reference.h"
#include "melforge/common/errors.h"

namespace melforge_test_filterbank {

using namespace melforge;
using namespace melforge::mel;

namespace {

MelArgs fb_args(int sample_rate, int n_fft, int n_mels, float f_min, float f_max, MelScale scale, MelNorm norm) {
  MelArgs a;
  a.sample_rate = sample_rate;
  a.n_fft = n_fft;
  a.n_mels = n_mels;
  a.f_min = f_min;
  a.f_max = f_max;
  a.mel_scale = scale;
  a.mel_norm = norm;
  return a;
}

/// Largest |got - want| in band m of two dense [n_freqs][n_mels] matrices, divided by the band's peak in `want` (an
/// all-zero band of `want` counts 0 when `got`'s is all zero too, else infinity).
template <class T>
double worst_band_error(const std::vector<float>& got, const std::vector<T>& want, int n_freqs, int n_mels) {
  double worst = 0.0;
  for (int m = 0; m < n_mels; ++m) {
    double peak = 0.0, err = 0.0;
    for (int k = 0; k < n_freqs; ++k) {
      const auto i = static_cast<std::size_t>(k) * n_mels + m;
      peak = std::max(peak, static_cast<double>(want[i]));
      err = std::max(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    }
    worst = std::max(worst, peak > 0.0 ? err / peak : (err > 0.0 ? INFINITY : 0.0));
  }
  return worst;
}

}  // namespace

TEST_CASE("filterbank matches torchaudio melscale_fbanks", "[filterbank]") {
  const auto manifest = test::load_mel_manifest();
  REQUIRE(manifest.at("filterbanks").size() >= 8);
  std::set<std::string> kinds;
  for (const auto& f : manifest.at("filterbanks")) {
    const MelArgs a = fb_args(f.at("sample_rate"), f.at("n_fft"), f.at("n_mels"), f.at("f_min").get<float>(),
                              f.at("f_max").get<float>(), parse_mel_scale(f.at("mel_scale")),
                              parse_mel_norm(f.at("mel_norm")));
    kinds.insert(to_string(a.mel_scale) + "/" + to_string(a.mel_norm));
    const int n_freqs = f.at("n_freqs");
    const auto want = test::load_f32(f.at("file"), static_cast<int64_t>(n_freqs) * a.n_mels);
    const Filterbank fb = build_filterbank(a);
    REQUIRE(fb.n_freqs == n_freqs);
    REQUIRE(fb.n_mels == a.n_mels);
    const auto got = fb.dense();
    // Every float32 step of torchaudio is reproduced except torch's SIMD pow/exp (SLEEF, within 1 ulp), so a filter
    // edge can sit one float32 ulp away; f/df amplifies that to at most ~1e-5 of the band's peak.
    const double worst = worst_band_error(got, want, n_freqs, a.n_mels);
    std::size_t equal = 0;
    for (std::size_t i = 0; i < got.size(); ++i) equal += got[i] == want[i] ? 1 : 0;
    INFO(f.at("name").get<std::string>() << ": worst error / band peak " << worst << ", bitwise equal "
                                         << equal << " of " << got.size());
    CHECK(worst <= 2e-5);
    CHECK(static_cast<double>(equal) >= 0.97 * static_cast<double>(got.size()));
  }
  CHECK(kinds == std::set<std::string>{"htk/none", "htk/slaney", "slaney/none", "slaney/slaney"});
}

TEST_CASE("filterbank matches the formulas in double", "[filterbank]") {
  const int sample_rate = GENERATE(8000, 16000, 22050, 44100);
  const int n_fft = GENERATE(256, 400, 512, 1024, 2048);
  const int n_mels = GENERATE(20, 40, 64);
  const MelScale scale = GENERATE(MelScale::htk, MelScale::slaney);
  const MelNorm norm = GENERATE(MelNorm::none, MelNorm::slaney);
  const float f_min = GENERATE(0.0f, 50.0f);
  const MelArgs a = fb_args(sample_rate, n_fft, n_mels, f_min, 0.0f, scale, norm);
  const auto want = test::reference_filterbank(a);
  CAPTURE(sample_rate, n_fft, n_mels, to_string(scale), to_string(norm), f_min);
  std::vector<int> empty_bands;
  for (int m = 0; m < n_mels; ++m) {
    double peak = 0.0;
    for (int k = 0; k < a.n_freqs(); ++k) peak = std::max(peak, want[static_cast<std::size_t>(k) * n_mels + m]);
    if (peak == 0.0) empty_bands.push_back(m);
  }
  CHECK_NOTHROW(a.validate());
  const Filterbank fb = build_filterbank(a);
  CHECK(fb.empty_bands() == empty_bands);
  CHECK(empty_bands_warning(a).empty() == empty_bands.empty());
  const auto got = fb.dense();
  if (empty_bands.empty()) {
    CHECK(worst_band_error(got, want, a.n_freqs(), n_mels) <= 3e-5);
    return;
  }
  // Bands narrower than the bin spacing (where some are empty) hold a bin or two near a triangle's edge, whose small
  // weight carries the float32 rounding of the edges (filterbank.cpp) relative to the triangle's height, not to
  // that weight: compare against the filterbank's largest weight instead.
  double peak = 0.0, err = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    peak = std::max(peak, want[i]);
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  CHECK(err <= 3e-5 * peak);
}

TEST_CASE("sparse filterbank storage equals the dense matrix", "[filterbank]") {
  const int n_fft = GENERATE(256, 512, 1000);
  const int n_mels = GENERATE(1, 8, 24);
  const MelScale scale = GENERATE(MelScale::htk, MelScale::slaney);
  const MelNorm norm = GENERATE(MelNorm::none, MelNorm::slaney);
  const MelArgs a = fb_args(16000, n_fft, n_mels, 0.0f, 0.0f, scale, norm);
  const Filterbank fb = build_filterbank(a);
  const auto dense = fb.dense();
  REQUIRE(fb.begin.size() == static_cast<std::size_t>(n_mels));
  REQUIRE(fb.end.size() == static_cast<std::size_t>(n_mels));
  REQUIRE(fb.offset.size() == static_cast<std::size_t>(n_mels) + 1);
  CHECK(fb.offset.front() == 0);
  CHECK(fb.offset.back() == static_cast<int32_t>(fb.weights.size()));
  CHECK(fb.nnz() == static_cast<int64_t>(fb.weights.size()));
  const auto reference = test::reference_filterbank(a);
  for (int m = 0; m < n_mels; ++m) {
    CAPTURE(m);
    REQUIRE(fb.begin[m] >= 0);
    REQUIRE(fb.end[m] > fb.begin[m]);
    REQUIRE(fb.end[m] <= fb.n_freqs);
    REQUIRE(fb.offset[m + 1] - fb.offset[m] == fb.end[m] - fb.begin[m]);
    for (int k = 0; k < fb.n_freqs; ++k) {
      const float d = dense[static_cast<std::size_t>(k) * n_mels + m];
      if (k < fb.begin[m] || k >= fb.end[m]) {
        CHECK(d == 0.0f);
        CHECK(reference[static_cast<std::size_t>(k) * n_mels + m] <= 1e-6);
      } else {
        CHECK(d == fb.weights[static_cast<std::size_t>(fb.offset[m] + k - fb.begin[m])]);
        CHECK(d > 0.0f);
      }
    }
  }
  // The sparse product (what the engines do) equals the dense matrix product, bitwise: the same terms in the same
  // order, the dense one only adding exact zeros.
  std::vector<float> power(static_cast<std::size_t>(fb.n_freqs));
  for (int k = 0; k < fb.n_freqs; ++k) power[k] = 1.0f + 0.37f * static_cast<float>((k * 7919) % 101);
  for (int m = 0; m < n_mels; ++m) {
    float sparse = 0.0f, full = 0.0f;
    for (int k = fb.begin[m]; k < fb.end[m]; ++k) sparse += fb.weights[fb.offset[m] + k - fb.begin[m]] * power[k];
    for (int k = 0; k < fb.n_freqs; ++k) full += dense[static_cast<std::size_t>(k) * n_mels + m] * power[k];
    CHECK(sparse == full);
  }
}

TEST_CASE("cached_filterbank builds once per configuration, from any thread", "[filterbank]") {
  MelArgs a = fb_args(16000, 512, 40, 0.0f, 0.0f, MelScale::htk, MelNorm::none);
  const auto first = cached_filterbank(a);
  CHECK(cached_filterbank(a) == first);
  MelArgs same = a;
  same.hop_length = 100;
  same.log = LogMode::ln;
  CHECK(cached_filterbank(same) == first);
  MelArgs other = a;
  other.mel_norm = MelNorm::slaney;
  CHECK(cached_filterbank(other) != first);
  other = a;
  other.f_max = 7000.0f;
  CHECK(cached_filterbank(other) != first);
  MelArgs explicit_fmax = a;
  explicit_fmax.f_max = 8000.0f;
  CHECK(cached_filterbank(explicit_fmax) == first);
  CHECK(first->weights == build_filterbank(a).weights);

  MelArgs fresh = fb_args(16000, 768, 33, 10.0f, 0.0f, MelScale::slaney, MelNorm::none);
  std::vector<std::shared_ptr<const Filterbank>> got(8);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = cached_filterbank(fresh); });
  for (auto& t : threads) t.join();
  for (const auto& p : got) CHECK(p == got.front());
}

TEST_CASE("validate accepts the defaults and edge values", "[filterbank][args]") {
  MelArgs a;
  CHECK_NOTHROW(a.validate());
  CHECK_NOTHROW(a.validate(16000));
  a.f_max = 8000.0f;
  CHECK_NOTHROW(a.validate());
  a.center = true;
  a.pad_mode = PadMode::reflect;
  CHECK_NOTHROW(a.validate(257));
  a.pad_mode = PadMode::constant;
  CHECK_NOTHROW(a.validate(1));
  a.center = false;
  CHECK_NOTHROW(a.validate(512));
  a.win_length = 512;
  a.hop_length = 1;
  CHECK_NOTHROW(a.validate(512));
}

TEST_CASE("validate rejects out-of-range parameters", "[filterbank][args]") {
  struct Case {
    const char* what;
    std::function<void(MelArgs&)> change;
    int64_t segment_samples;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"sample_rate 0", [](MelArgs& a) { a.sample_rate = 0; }, 0, "sample_rate"},
      {"n_fft 1", [](MelArgs& a) { a.n_fft = 1; }, 0, "n_fft"},
      {"win_length > n_fft", [](MelArgs& a) { a.win_length = 513; }, 0, "win_length"},
      {"negative win_length", [](MelArgs& a) { a.win_length = -1; }, 0, "win_length"},
      {"negative hop", [](MelArgs& a) { a.hop_length = -5; }, 0, "hop_length"},
      {"effective hop 0", [](MelArgs& a) { a.win_length = 1; }, 0, "hop"},
      {"power 0", [](MelArgs& a) { a.power = 0.0f; }, 0, "power"},
      {"power negative", [](MelArgs& a) { a.power = -2.0f; }, 0, "power"},
      {"power NaN", [](MelArgs& a) { a.power = NAN; }, 0, "power"},
      {"n_mels 0", [](MelArgs& a) { a.n_mels = 0; }, 0, "n_mels"},
      {"n_mels above n_fft/2+1", [](MelArgs& a) { a.n_fft = 256; a.n_mels = 130; }, 0, "too large for n_fft"},
      {"f_max above Nyquist", [](MelArgs& a) { a.f_max = 8000.5f; }, 0, "Nyquist"},
      {"f_max negative", [](MelArgs& a) { a.f_max = -1.0f; }, 0, "f_max"},
      {"f_min negative", [](MelArgs& a) { a.f_min = -1.0f; }, 0, "f_min"},
      {"f_min == f_max", [](MelArgs& a) { a.f_min = 4000.0f; a.f_max = 4000.0f; }, 0, "f_min"},
      {"f_min > f_max", [](MelArgs& a) { a.f_min = 5000.0f; a.f_max = 4000.0f; }, 0, "f_min"},
      {"f_min at default Nyquist", [](MelArgs& a) { a.f_min = 8000.0f; }, 0, "f_min"},
      {"amin 0", [](MelArgs& a) { a.amin = 0.0f; }, 0, "amin"},
      {"log_eps 0", [](MelArgs& a) { a.log_eps = 0.0f; }, 0, "log_eps"},
      {"segment too short, no centre", [](MelArgs& a) { a.center = false; }, 511, "no frame"},
      {"segment too short to reflect", [](MelArgs& a) { a.pad_mode = PadMode::reflect; }, 256, "reflect"},
  };
  for (const auto& c : cases) {
    MelArgs a;
    c.change(a);
    INFO(c.what);
    CHECK_THROWS_AS(a.validate(c.segment_samples), InvalidArgument);
    CHECK_THROWS_WITH(a.validate(c.segment_samples), Catch::Contains(c.message));
  }
}

TEST_CASE("bands without an FFT bin are kept empty and warned about, as torchaudio does", "[filterbank]") {
  struct Case {
    const char* what;
    MelArgs args;
  };
  const std::vector<Case> cases = {
      {"torchaudio's defaults n_fft 400, n_mels 128",
       fb_args(16000, 400, 128, 0.0f, 0.0f, MelScale::htk, MelNorm::none)},
      {"n_fft 256, n_mels 128", fb_args(16000, 256, 128, 0.0f, 0.0f, MelScale::htk, MelNorm::none)},
      {"n_mels 64 under 500 Hz", fb_args(16000, 512, 64, 0.0f, 500.0f, MelScale::htk, MelNorm::slaney)},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const MelArgs& a = c.args;
    CHECK_NOTHROW(a.validate());
    const Filterbank fb = build_filterbank(a);
    const std::vector<float> dense = fb.dense();
    std::vector<int> zero_columns;
    for (int m = 0; m < a.n_mels; ++m) {
      bool all_zero = true;
      for (int k = 0; k < fb.n_freqs; ++k) all_zero = all_zero && dense[static_cast<std::size_t>(k) * a.n_mels + m] == 0;
      if (all_zero) zero_columns.push_back(m);
    }
    REQUIRE_FALSE(zero_columns.empty());
    CHECK(fb.empty_bands() == zero_columns);
    CHECK(fb.offset[a.n_mels] == static_cast<int32_t>(fb.weights.size()));
    const std::string warning = empty_bands_warning(a);
    CHECK_THAT(warning, Catch::StartsWith("At least one mel filterbank has all zero values (mel band") &&
                            Catch::Contains("of " + std::to_string(a.n_mels)) &&
                            Catch::Contains("n_fft (" + std::to_string(a.n_fft)) &&
                            Catch::Contains(" " + std::to_string(zero_columns.front())));
  }
  CHECK(empty_bands_warning(fb_args(16000, 512, 64, 0.0f, 0.0f, MelScale::htk, MelNorm::none)).empty());
  CHECK(build_filterbank(fb_args(16000, 512, 64, 0.0f, 0.0f, MelScale::htk, MelNorm::none)).empty_bands().empty());
}

TEST_CASE("n_frames follows torch.stft", "[filterbank][args]") {
  MelArgs a;
  CHECK(a.n_frames(16000) == 63);
  CHECK(a.n_frames(0) == 1);
  a.center = false;
  CHECK(a.n_frames(511) == 0);
  CHECK(a.n_frames(512) == 1);
  CHECK(a.n_frames(767) == 1);
  CHECK(a.n_frames(768) == 2);
  a.hop_length = 160;
  a.win_length = 400;
  CHECK(a.n_frames(16000) == 1 + (16000 - 512) / 160);
}

}  // namespace melforge_test_filterbank
