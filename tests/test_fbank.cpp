// Kaldi fbank on the CPU engine: against torchaudio.compliance.kaldi.fbank (tests/data/fbank, made by
// tools/gen_fbank_fixtures.py) and get_mel_banks, against a naive double-precision reference written from torchaudio's
// code (random parameter draws, dither included), frame counts, short clips, compute() against compute_clips,
// float16, threads, host bytes and the parameter checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fbank/fbank_args.h"
#include "fbank/fbank_math.h"
#include "mel/filterbank.h"
#include "mel/half.h"
#include "mel/mel_cpu.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge_test_paths.h"

namespace melforge_test_fbank {

using namespace melforge;
using namespace melforge::mel;
using fbank::FbankArgs;

namespace {

std::filesystem::path fixture_dir() { return std::filesystem::path(MELFORGE_TEST_DATA_DIR) / "fbank"; }

nlohmann::json load_manifest() {
  std::ifstream in(fixture_dir() / "manifest.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

/// The little-endian float32 values of fixture file `name`, which must hold `expected` of them.
std::vector<float> load_f32(const std::string& name, int64_t expected) {
  std::ifstream in(fixture_dir() / name, std::ios::binary);
  REQUIRE(in);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(static_cast<int64_t>(bytes.size()) == 4 * expected);
  std::vector<float> values(static_cast<std::size_t>(expected));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = bytes[4 * i] | (bytes[4 * i + 1] << 8) | (bytes[4 * i + 2] << 16) |
                       (static_cast<uint32_t>(bytes[4 * i + 3]) << 24);
    values[i] = std::bit_cast<float>(u);
  }
  return values;
}

/// MelArgs of a manifest set's torchaudio keyword arguments; an unknown key fails the test.
MelArgs args_from_json(const nlohmann::json& params) {
  FbankArgs f;
  int rate = 16000;
  for (const auto& [key, v] : params.items()) {
    if (key == "sample_frequency") rate = static_cast<int>(v.get<double>());
    else if (key == "num_mel_bins") f.num_mel_bins = v.get<int>();
    else if (key == "frame_length") f.frame_length = v.get<double>();
    else if (key == "frame_shift") f.frame_shift = v.get<double>();
    else if (key == "window_type") f.window_type = fbank::parse_kaldi_window(v.get<std::string>());
    else if (key == "blackman_coeff") f.blackman_coeff = v.get<double>();
    else if (key == "preemphasis_coefficient") f.preemphasis_coefficient = v.get<double>();
    else if (key == "remove_dc_offset") f.remove_dc_offset = v.get<bool>();
    else if (key == "dither") f.dither = v.get<double>();
    else if (key == "round_to_power_of_two") f.round_to_power_of_two = v.get<bool>();
    else if (key == "snip_edges") f.snip_edges = v.get<bool>();
    else if (key == "low_freq") f.low_freq = v.get<double>();
    else if (key == "high_freq") f.high_freq = v.get<double>();
    else if (key == "use_energy") f.use_energy = v.get<bool>();
    else if (key == "raw_energy") f.raw_energy = v.get<bool>();
    else if (key == "energy_floor") f.energy_floor = v.get<double>();
    else if (key == "htk_compat") f.htk_compat = v.get<bool>();
    else if (key == "use_log_fbank") f.use_log_fbank = v.get<bool>();
    else if (key == "use_power") f.use_power = v.get<bool>();
    else if (key == "subtract_mean") f.subtract_mean = v.get<bool>();
    else FAIL("unknown fbank parameter in the manifest: " << key);
  }
  MelArgs a;
  a.sample_rate = rate;
  a.use_fbank(f);
  return a;
}

EngineConfig config_of(const MelArgs& a, DType dtype = DType::float32, int threads = 1, int64_t segment = 16000) {
  EngineConfig c;
  c.mel = a;
  c.segment_samples = segment;
  c.dtype = dtype;
  c.threads = threads;
  return c;
}

/// compute_clips of a fresh engine over the clips `offsets` of `x`, as bytes.
std::vector<unsigned char> run_clips(const EngineConfig& config, const std::vector<float>& x,
                                     const std::vector<int64_t>& offsets, ClipBatch* planned = nullptr) {
  auto engine = make_cpu_engine(config);
  const ClipBatch batch = plan_clips(config.mel, config.dtype, offsets);
  std::vector<unsigned char> out(static_cast<std::size_t>(batch.out_bytes()), 0xff);
  engine->compute_clips(x.data(), batch, out.data());
  if (planned != nullptr) *planned = batch;
  return out;
}

std::vector<float> as_floats(const std::vector<unsigned char>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

/// Kaldi's mel scale, written out.
double ref_mel(double hz) { return 1127.0 * std::log(1.0 + hz / 700.0); }

/// Kaldi's window value, in double, written out from torchaudio's _feature_window_function.
double ref_window(fbank::KaldiWindow type, int j, int n, double blackman) {
  const double pi = 3.14159265358979323846;
  const double a = 2.0 * pi / (n - 1);
  const double hann = 0.5 - 0.5 * std::cos(a * j);
  switch (type) {
    case fbank::KaldiWindow::povey: return std::pow(hann, 0.85);
    case fbank::KaldiWindow::hamming: return 0.54 - 0.46 * std::cos(a * j);
    case fbank::KaldiWindow::hanning: return hann;
    case fbank::KaldiWindow::rectangular: return 1.0;
    case fbank::KaldiWindow::blackman: return blackman - 0.5 * std::cos(a * j) + (0.5 - blackman) * std::cos(2 * a * j);
  }
  return 0.0;
}

/// torchaudio's fbank of the `n` samples at `x` in double ([frames][bins]), frames as the engine gives them (a clip
/// without a frame gets one, zero-padded); the dither noise is dither_gauss's, as the engine's.
std::vector<double> reference_fbank(const FbankArgs& f, int rate, const float* x, int64_t n, int64_t* frames_out) {
  const int win = static_cast<int>(rate * f.frame_length * 0.001);
  const int shift = static_cast<int>(rate * f.frame_shift * 0.001);
  int padded = win;
  if (f.round_to_power_of_two) {
    padded = 1;
    while (padded < win) padded *= 2;
  }
  int64_t m = f.snip_edges ? (n < win ? 0 : 1 + (n - win) / shift) : (n + shift / 2) / shift;
  m = std::max<int64_t>(m, 1);
  const int64_t left = f.snip_edges ? 0 : win / 2 - shift / 2;
  const auto sample = [&](int64_t p) -> double {
    if (p >= 0 && p < n) return x[p];
    if (f.snip_edges || n == 0) return 0.0;
    if (p < 0 && p >= -n) return x[-p - 1];
    if (p >= n && p < 2 * n) return x[2 * n - 1 - p];
    return 0.0;
  };
  const int nfft = padded / 2;
  const double nyquist = 0.5 * rate;
  const double high = f.high_freq <= 0 ? f.high_freq + nyquist : f.high_freq;
  const double mlo = ref_mel(f.low_freq), delta = (ref_mel(high) - mlo) / (f.num_mel_bins + 1);
  const double pi = 3.14159265358979323846;
  const int bins = f.num_mel_bins + (f.use_energy ? 1 : 0);
  std::vector<double> cos_table(static_cast<std::size_t>(padded)), sin_table(static_cast<std::size_t>(padded));
  for (int i = 0; i < padded; ++i) {
    cos_table[i] = std::cos(2.0 * pi * i / padded);
    sin_table[i] = std::sin(2.0 * pi * i / padded);
  }
  std::vector<double> weights(static_cast<std::size_t>(f.num_mel_bins) * nfft);
  for (int b = 0; b < f.num_mel_bins; ++b) {
    const double l = mlo + b * delta, c = mlo + (b + 1) * delta, r = mlo + (b + 2) * delta;
    for (int k = 0; k < nfft; ++k) {
      const double mel = ref_mel(static_cast<double>(rate) / padded * k);
      const double w = std::min((mel - l) / (c - l), (r - mel) / (r - c));
      weights[static_cast<std::size_t>(b) * nfft + k] = std::max(0.0, w);
    }
  }
  std::vector<double> out(static_cast<std::size_t>(m * bins));
  std::vector<double> frame(static_cast<std::size_t>(padded)), power(static_cast<std::size_t>(nfft));
  for (int64_t t = 0; t < m; ++t) {
    std::fill(frame.begin(), frame.end(), 0.0);
    for (int j = 0; j < win; ++j) {
      frame[j] = sample(t * shift - left + j);
      if (f.dither > 0) frame[j] += static_cast<double>(fbank::dither_gauss(f.dither_seed, t, j)) * f.dither;
    }
    if (f.remove_dc_offset) {
      double mean = 0.0;
      for (int j = 0; j < win; ++j) mean += frame[j] / win;
      for (int j = 0; j < win; ++j) frame[j] -= mean;
    }
    const auto energy_of = [&] {
      double e = 0.0;
      for (const double v : frame) e += v * v;
      double le = std::log(std::max(e, static_cast<double>(FLT_EPSILON)));
      return f.energy_floor > 0 ? std::max(le, std::log(f.energy_floor)) : le;
    };
    double energy = f.raw_energy ? energy_of() : 0.0;
    for (int j = win - 1; j >= 0; --j) {
      frame[j] -= f.preemphasis_coefficient * frame[j > 0 ? j - 1 : 0];
      frame[j] *= ref_window(f.window_type, j, win, f.blackman_coeff);
    }
    if (!f.raw_energy) energy = energy_of();
    for (int k = 0; k < nfft; ++k) {
      double re = 0.0, im = 0.0;
      for (int j = 0; j < win; ++j) {
        const auto i = static_cast<std::size_t>((static_cast<int64_t>(k) * j) % padded);
        re += frame[j] * cos_table[i];
        im -= frame[j] * sin_table[i];
      }
      power[k] = f.use_power ? re * re + im * im : std::sqrt(re * re + im * im);
    }
    double* row = out.data() + t * bins;
    const int first = f.use_energy && !f.htk_compat ? 1 : 0;
    for (int b = 0; b < f.num_mel_bins; ++b) {
      double e = 0.0;
      for (int k = 0; k < nfft; ++k) e += weights[static_cast<std::size_t>(b) * nfft + k] * power[k];
      row[first + b] = f.use_log_fbank ? std::log(std::max(e, static_cast<double>(FLT_EPSILON))) : e;
    }
    if (f.use_energy) row[f.htk_compat ? bins - 1 : 0] = energy;
  }
  if (f.subtract_mean) {
    for (int b = 0; b < bins; ++b) {
      double mean = 0.0;
      for (int64_t t = 0; t < m; ++t) mean += out[t * bins + b] / m;
      for (int64_t t = 0; t < m; ++t) out[t * bins + b] -= mean;
    }
  }
  *frames_out = m;
  return out;
}

/// Worst |got - want| / (atol + rtol |want|) over all values (<= 1 passes).
template <class W>
double worst_ratio(const std::vector<float>& got, const W& want, double atol, double rtol, std::size_t* at) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    const double r = std::abs(got[i] - static_cast<double>(want[i])) / (atol + rtol * std::abs(want[i]));
    if (!(r <= worst)) {
      worst = r;
      *at = i;
    }
  }
  return worst;
}

/// The error allowed for each value [frames][bins] of the reference `f` gives for a clip, as the mel tests' model
/// (tests/mel_reference.h) in log terms: 2e-3 log units (linear outputs: 2e-3 relative) plus a floor of 1e-6 of the
/// frame's largest mel energy P_t (a float32 FFT's error is about 1e-7 of the frame's largest magnitude in every bin,
/// so a band far below its frame's peak carries no relative precision: log terms add 1e-6 P_t / e; with use_power
/// false 1e-4 P_t, as magnitudes add that noise linearly over a band's bins, up to ~100 of them), and with
/// subtract_mean the column's mean allowance on top (the mean carries the errors of the column). The energy column:
/// 2e-3 log units. `linear`: the reference without the log and without subtract_mean.
std::vector<double> allowed_errors(const FbankArgs& f, const std::vector<double>& linear, int64_t frames) {
  const int bins = f.bins();
  const int energy_col = f.use_energy ? (f.htk_compat ? bins - 1 : 0) : -1;
  std::vector<double> allowed(linear.size());
  const double floor_rel = f.use_power ? 1e-6 : 1e-4;
  for (int64_t t = 0; t < frames; ++t) {
    double peak = 0.0;
    for (int b = 0; b < bins; ++b)
      if (b != energy_col) peak = std::max(peak, linear[t * bins + b]);
    for (int b = 0; b < bins; ++b) {
      const double e = linear[t * bins + b];
      double a = 2e-3;
      if (b != energy_col) {
        a = f.use_log_fbank ? 2e-3 + floor_rel * peak / std::max(e, static_cast<double>(FLT_EPSILON))
                            : 2e-3 * std::abs(e) + floor_rel * peak + 1e-30;
      }
      allowed[t * bins + b] = a;
    }
  }
  if (!f.subtract_mean) return allowed;
  for (int b = 0; b < bins; ++b) {
    double mean = 0.0;
    for (int64_t t = 0; t < frames; ++t) mean += allowed[t * bins + b] / frames;
    for (int64_t t = 0; t < frames; ++t) allowed[t * bins + b] += mean;
  }
  return allowed;
}

/// Seeded int16-scale signal: noise plus tones, integer-valued.
std::vector<float> int16_signal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 800.0);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double v = 6000 * std::sin(0.061 * i) + 3000 * std::sin(0.73 * i + 0.2) + noise(rng);
    x[static_cast<std::size_t>(i)] = static_cast<float>(std::round(v));
  }
  return x;
}

/// A random valid parameter draw.
MelArgs random_args(std::mt19937& rng) {
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  FbankArgs f;
  const int rates[] = {8000, 16000, 22050};
  MelArgs a;
  a.sample_rate = rates[pick(3)];
  f.round_to_power_of_two = pick(3) != 0;
  const int window = (a.sample_rate * (15 + pick(16)) / 1000) / 2 * 2 + (f.round_to_power_of_two ? pick(2) : 0);
  const int shift = a.sample_rate * (5 + pick(11)) / 1000 + pick(2);
  f.frame_length = (window + 0.5) * 1000.0 / a.sample_rate;
  f.frame_shift = (shift + 0.5) * 1000.0 / a.sample_rate;
  f.window_type = static_cast<fbank::KaldiWindow>(pick(5));
  f.blackman_coeff = 0.38 + 0.01 * pick(10);
  f.preemphasis_coefficient = pick(3) == 0 ? 0.0 : 0.9 + 0.01 * pick(10);
  f.remove_dc_offset = pick(4) != 0;
  f.dither = pick(3) == 0 ? 0.0 : 0.5 + pick(3);
  f.dither_seed = rng();
  f.snip_edges = pick(2) == 0;
  f.low_freq = 10.0 * pick(10);
  f.high_freq = pick(2) == 0 ? 0.0 : -100.0 * pick(5);
  f.use_energy = pick(2) == 0;
  f.raw_energy = pick(2) == 0;
  f.energy_floor = pick(2) == 0 ? 0.0 : 1.0;
  f.htk_compat = pick(2) == 0;
  f.use_log_fbank = pick(5) != 0;
  f.use_power = pick(3) != 0;
  f.subtract_mean = pick(4) == 0;
  f.num_mel_bins = 10 + pick(40);
  a.use_fbank(f);
  REQUIRE(a.win() == window);
  REQUIRE(a.hop() == shift);
  return a;
}

}  // namespace

TEST_CASE("fbank fixtures: the CPU engine matches torchaudio.compliance.kaldi.fbank", "[fbank]") {
  const nlohmann::json manifest = load_manifest();
  REQUIRE(manifest.at("sets").size() == 21);
  const auto index = GENERATE(range(0, 21));
  REQUIRE(static_cast<std::size_t>(index) < manifest.at("sets").size());
  const nlohmann::json& set = manifest.at("sets").at(static_cast<std::size_t>(index));
  const std::string name = set.at("name");
  const MelArgs a = args_from_json(set.at("params"));
  const int64_t n = set.at("samples");
  const auto x = load_f32(set.at("signal"), n);
  const int64_t frames = set.at("frames");
  const int bins = set.at("bins");
  const auto want = load_f32(set.at("output"), frames * bins);
  CAPTURE(name, a.to_string());
  ClipBatch batch;
  const std::vector<int64_t> offsets{0, n};
  const auto got = as_floats(run_clips(config_of(a, DType::float32, 2), x, offsets, &batch));
  REQUIRE(batch.total_frames() == frames);
  REQUIRE(batch.n_mels == bins);
  REQUIRE(static_cast<int>(batch.flags[0]) == 0);
  const double atol = set.at("atol"), rtol = set.at("rtol");
  std::size_t at = 0;
  const double worst = worst_ratio(got, want, atol, rtol, &at);
  INFO("worst error / tolerance " << worst << " at frame " << at / bins << " bin " << at % bins << ": "
                                  << got[at] << " vs torchaudio " << want[at]);
  CHECK(worst <= 1.0);
  const std::vector<float> silent(got.size(), silence_value(a));
  std::size_t unused = 0;
  CHECK(worst_ratio(silent, want, atol, rtol, &unused) > 1.0);
}

TEST_CASE("fbank filterbank: build_kaldi_filterbank matches get_mel_banks", "[fbank]") {
  const nlohmann::json manifest = load_manifest();
  REQUIRE(manifest.at("banks").size() == 6);
  const auto index = GENERATE(range(0, 6));
  const nlohmann::json& bank = manifest.at("banks").at(static_cast<std::size_t>(index));
  const int bins = bank.at("num_mel_bins"), padded = bank.at("padded_window_size");
  FbankArgs f;
  f.num_mel_bins = bins;
  f.low_freq = bank.at("low_freq");
  f.high_freq = bank.at("high_freq");
  MelArgs a;
  a.sample_rate = static_cast<int>(bank.at("sample_frequency").get<double>());
  f.frame_length = (padded + 0.5) * 1000.0 / a.sample_rate;
  f.round_to_power_of_two = false;
  a.use_fbank(f);
  REQUIRE(a.n_fft == padded);
  const std::vector<float> want = load_f32(bank.at("file"), static_cast<int64_t>(bins) * (padded / 2));
  const Filterbank fb = build_kaldi_filterbank(a);
  REQUIRE(fb.n_mels == bins);
  REQUIRE(fb.n_freqs == padded / 2 + 1);
  const std::vector<float> dense = fb.dense();
  double worst = 0.0;
  int64_t differing = 0;
  for (int b = 0; b < bins; ++b) {
    CHECK(dense[static_cast<std::size_t>(padded / 2) * bins + b] == 0.0f);
    for (int k = 0; k < padded / 2; ++k) {
      const float got = dense[static_cast<std::size_t>(k) * bins + b];
      const float w = want[static_cast<std::size_t>(b) * (padded / 2) + k];
      worst = std::max(worst, static_cast<double>(std::abs(got - w)));
      differing += got != w;
    }
  }
  CAPTURE(bank.at("name").get<std::string>(), differing);
  CHECK(worst <= 2e-5);
  CHECK(cached_filterbank(a)->weights == fb.weights);
}

TEST_CASE("fbank: the CPU engine equals a naive double reference over random parameters, dither included",
          "[fbank]") {
  const uint32_t seed = GENERATE(range(1u, 17u));
  std::mt19937 rng(seed);
  const MelArgs a = random_args(rng);
  const int64_t lengths[] = {a.win() * 3 + 17, a.win() - 5, 1, 0, a.win() + a.hop() * 5};
  std::vector<float> x;
  std::vector<int64_t> offsets{0};
  for (const int64_t n : lengths) {
    const auto part = int16_signal(n, seed * 7 + static_cast<uint32_t>(n));
    x.insert(x.end(), part.begin(), part.end());
    offsets.push_back(static_cast<int64_t>(x.size()));
  }
  CAPTURE(seed, a.to_string());
  ClipBatch batch;
  const auto got = as_floats(run_clips(config_of(a, DType::float32, 2), x, offsets, &batch));
  const int bins = a.n_mels;
  for (int64_t c = 0; c < batch.clips(); ++c) {
    int64_t frames = 0;
    const auto want = reference_fbank(a.fbank, a.sample_rate, x.data() + offsets[c], batch.samples(c), &frames);
    REQUIRE(frames == batch.frames(c));
    const auto begin = got.begin() + batch.frame_offsets[static_cast<std::size_t>(c)] * bins;
    const std::vector<float> clip(begin, begin + frames * bins);
    FbankArgs plain = a.fbank;
    plain.use_log_fbank = false;
    plain.subtract_mean = false;
    const auto linear = reference_fbank(plain, a.sample_rate, x.data() + offsets[c], batch.samples(c), &frames);
    const std::vector<double> allowed = allowed_errors(a.fbank, linear, frames);
    double worst = 0.0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < clip.size(); ++i) {
      REQUIRE(std::isfinite(clip[i]));
      const double r = std::abs(clip[i] - want[i]) / allowed[i];
      if (!(r <= worst)) {
        worst = r;
        at = i;
      }
    }
    INFO("clip " << c << " of " << batch.samples(c) << " samples: worst " << worst << " at " << at << ": "
                 << clip[at] << " vs " << want[at]);
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("fbank: frame counts around window boundaries and the clip shorter than a window", "[fbank]") {
  const bool snip = GENERATE(true, false);
  FbankArgs f;
  f.snip_edges = snip;
  f.frame_shift = 7.0;
  MelArgs a;
  a.use_fbank(f);
  const int win = a.win(), shift = a.hop();
  REQUIRE(win == 400);
  REQUIRE(shift == 112);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{55}, int64_t{56}, int64_t{111}, int64_t{399}, int64_t{400},
                    int64_t{401}, int64_t{511}, int64_t{512}, int64_t{513}, int64_t{400 + 3 * 112 - 1},
                    int64_t{400 + 3 * 112}, int64_t{5 * 112 - 57}, int64_t{5 * 112 - 56}}) {
    const int64_t torchaudio = snip ? (n < win ? 0 : 1 + (n - win) / shift) : (n + shift / 2) / shift;
    const ClipBatch b = plan_clips(a, DType::float32, std::vector<int64_t>{0, n});
    CAPTURE(n);
    CHECK(b.frames(0) == std::max<int64_t>(torchaudio, 1));
    CHECK(((b.flags[0] & kClipPaddedToFrame) != 0) == (torchaudio == 0));
    CHECK(a.n_frames(n) == torchaudio);
  }
  const auto x = int16_signal(250, 5);
  ClipBatch batch;
  const auto got = as_floats(run_clips(config_of(a), x, {0, 250}, &batch));
  int64_t frames = 0;
  const auto want = reference_fbank(a.fbank, a.sample_rate, x.data(), 250, &frames);
  REQUIRE(batch.frames(0) == (snip ? 1 : (250 + 56) / 112));
  REQUIRE(frames == batch.frames(0));
  CHECK(static_cast<int>(batch.flags[0]) == (snip ? kClipPaddedToFrame : 0));
  std::size_t at = 0;
  CHECK(worst_ratio(got, want, 2e-3, 0.0, &at) <= 1.0);
}

TEST_CASE("fbank: compute() of equal segments equals compute_clips, float16 is float32 rounded, threads agree",
          "[fbank]") {
  FbankArgs f;
  f.num_mel_bins = 80;
  f.use_energy = GENERATE(false, true);
  f.subtract_mean = GENERATE(false, true);
  f.snip_edges = GENERATE(true, false);
  f.dither = 1.0;
  f.htk_compat = f.use_energy && !f.subtract_mean;
  MelArgs a;
  a.use_fbank(f);
  const int64_t segment = 5123;
  const auto x = int16_signal(4 * segment + 300, 11);
  const std::vector<int64_t> seg_offsets{0, segment + 300, 2 * segment, 3 * segment + 300};
  const EngineConfig config = config_of(a, DType::float32, 1, segment);
  auto engine = make_cpu_engine(config);
  const MelLayout layout = engine->layout();
  CAPTURE(a.to_string());
  REQUIRE(layout.n_mels == f.bins());
  REQUIRE(layout.n_frames == a.n_frames(segment));
  std::vector<float> seg(seg_offsets.size() * static_cast<std::size_t>(layout.out_elems_per_segment()));
  engine->compute(x.data(), seg_offsets, seg.data());
  CHECK(engine->host_bytes() == cpu_engine_host_bytes(config));
  const int64_t block = std::min<int64_t>(32768 / a.n_fft, layout.n_frames);
  const int64_t n_freqs = a.n_fft / 2 + 1;
  const int64_t scratch_floats = block * a.n_fft + 2 * block * n_freqs + n_freqs * block + block * layout.n_mels +
                                 a.win() + (f.dither > 0 ? a.win() : 0) +
                                 (f.subtract_mean ? layout.out_elems_per_segment() : 0);
  CHECK(engine->host_bytes() == 4 * (scratch_floats + a.win()));
  for (std::size_t i = 0; i < seg_offsets.size(); ++i) {
    const std::vector<float> one(x.begin() + seg_offsets[i], x.begin() + seg_offsets[i] + segment);
    const auto clip = as_floats(run_clips(config, one, {0, segment}));
    REQUIRE(clip.size() == static_cast<std::size_t>(layout.out_elems_per_segment()));
    for (int t = 0; t < layout.n_frames; ++t) {
      for (int m = 0; m < layout.n_mels; ++m) {
        const float s = seg[i * layout.out_elems_per_segment() + static_cast<std::size_t>(m) * layout.n_frames + t];
        const float c = clip[static_cast<std::size_t>(t) * layout.n_mels + m];
        INFO("segment " << i << " frame " << t << " bin " << m);
        REQUIRE(std::abs(s - c) <= 1e-4f * (1.0f + std::abs(c)));
      }
    }
  }
  const std::vector<int64_t> clip_offsets{0, 3000, 3001, 9000, static_cast<int64_t>(x.size())};
  const auto f32 = run_clips(config_of(a, DType::float32, 1), x, clip_offsets);
  CHECK(run_clips(config_of(a, DType::float32, 3), x, clip_offsets) == f32);
  const auto f16 = run_clips(config_of(a, DType::float16, 3), x, clip_offsets);
  const auto values = as_floats(f32);
  REQUIRE(f16.size() == values.size() * 2);
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint16_t h = 0;
    std::memcpy(&h, f16.data() + 2 * i, 2);
    REQUIRE(h == float_to_half_bits(values[i]));
  }
  std::vector<float> seg3(seg.size());
  make_cpu_engine(config_of(a, DType::float32, 3, segment))->compute(x.data(), seg_offsets, seg3.data());
  CHECK(seg3 == seg);
}

TEST_CASE("fbank: an all-zero clip gives silence_value in the mel bins and the floored log energy", "[fbank]") {
  FbankArgs f;
  f.use_energy = true;
  f.use_log_fbank = GENERATE(true, false);
  f.energy_floor = GENERATE(0.0, 1.0, 0.5);
  MelArgs a;
  a.use_fbank(f);
  const std::vector<float> x(4000, 0.0f);
  const auto got = as_floats(run_clips(config_of(a), x, {0, 4000}));
  const float energy = f.energy_floor > 0 ? std::log(static_cast<float>(f.energy_floor)) : std::log(FLT_EPSILON);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    if (i % static_cast<std::size_t>(a.n_mels) == 0) {
      CHECK(got[i] == Approx(energy).margin(1e-6));
    } else {
      CHECK(got[i] == silence_value(a));
    }
  }
  CHECK(silence_value(a) == (f.use_log_fbank ? std::log(FLT_EPSILON) : 0.0f));
}

TEST_CASE("fbank: cached_filterbank keys on the features and the fbank parameters", "[fbank]") {
  FbankArgs f;
  f.num_mel_bins = 64;
  MelArgs a;
  a.use_fbank(f);
  MelArgs mel;
  mel.n_fft = a.n_fft;
  mel.n_mels = a.n_mels;
  const auto kaldi = cached_filterbank(a);
  CHECK(kaldi != cached_filterbank(mel));
  CHECK(kaldi->weights != cached_filterbank(mel)->weights);
  f.low_freq = 60.0;
  MelArgs b;
  b.use_fbank(f);
  CHECK(cached_filterbank(b)->weights != kaldi->weights);
  CHECK(cached_filterbank(a) == kaldi);
}

TEST_CASE("fbank: invalid parameters are refused naming the parameter", "[fbank]") {
  struct Case {
    const char* name;
    void (*set)(FbankArgs&);
  };
  const Case cases[] = {
      {"num_mel_bins", [](FbankArgs& f) { f.num_mel_bins = 3; }},
      {"frame_length", [](FbankArgs& f) { f.frame_length = 0.0; }},
      {"frame_shift", [](FbankArgs& f) { f.frame_shift = -1.0; }},
      {"preemphasis_coefficient", [](FbankArgs& f) { f.preemphasis_coefficient = 1.5; }},
      {"low_freq", [](FbankArgs& f) { f.low_freq = -5.0; }},
      {"high_freq", [](FbankArgs& f) { f.high_freq = 9000.0; }},
      {"dither", [](FbankArgs& f) { f.dither = -0.1; }},
      {"energy_floor", [](FbankArgs& f) { f.energy_floor = -1.0; }},
      {"vtln_warp", [](FbankArgs& f) { f.vtln_warp = 0.9; }},
      {"blackman_coeff", [](FbankArgs& f) { f.blackman_coeff = NAN; }},
      {"must be even", [](FbankArgs& f) {
         f.round_to_power_of_two = false;
         f.frame_length = 25.0625;
       }},
  };
  const auto index = GENERATE(range(0, 11));
  const Case& c = cases[index];
  FbankArgs f;
  c.set(f);
  MelArgs a;
  CAPTURE(c.name);
  CHECK_THROWS_AS(a.use_fbank(f), InvalidArgument);
  CHECK_THROWS_WITH(a.use_fbank(f), Catch::Contains(c.name));
  CHECK(!a.is_fbank());
}

}  // namespace melforge_test_fbank
