// The CPU waveform augmentation (kernels/augment): the SNR on the active signal, the looped noise, the FFT
// reverberation against a naive convolution, the direct-path alignment, gain, recipes, speed through the resampler,
// the banks, the flags, and apply() from several threads. The references (active powers, convolution, frequency)
// are written here, naively.
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>
#include <catch2/catch.hpp>

#include "audio/decode.h"
#include "augment/augment.h"
#include "augment/augment_math.h"
#include "melforge/common/errors.h"
#include "test_util.h"

namespace melforge_test_augment {

namespace {

namespace fs = std::filesystem;
namespace aug = melforge::augment;
using melforge::test::TempDir;

constexpr int kRate = 16000;
constexpr double kPi = 3.14159265358979323846;

/// `n` samples uniform in [-amp, amp] from a fixed seed.
std::vector<float> random_signal(int64_t n, uint32_t seed, float amp = 0.5f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-amp, amp);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(gen);
  return x;
}

/// A signal with a tone, an exact silence and a very quiet stretch (60+ dB down: not active).
std::vector<float> gappy_signal(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n), 0.0f);
  const auto quiet = random_signal(n, 99, 1e-4f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t part = 3 * i / n;
    if (part == 0) x[static_cast<size_t>(i)] = 0.5f * static_cast<float>(std::sin(2 * kPi * 440.0 * i / kRate));
    if (part == 2) x[static_cast<size_t>(i)] = quiet[static_cast<size_t>(i)];
  }
  for (int64_t i = n / 6; i < n / 6 + 500 && i < n; ++i) x[static_cast<size_t>(i)] *= 0.3f;
  return x;
}

aug::Bank bank_of(std::vector<std::vector<float>> clips, const std::vector<std::string>& groups = {}) {
  aug::Bank b;
  for (size_t i = 0; i < clips.size(); ++i) {
    const std::string group = groups.empty() ? "." : groups[i];
    b.clips.push_back({group + "/clip" + std::to_string(i) + ".wav", group, std::move(clips[i])});
  }
  return b;
}

/// Which frames of `clean` are active, naively: frame energies against the loudest minus 40 dB.
std::vector<bool> naive_active(const std::vector<float>& clean, int64_t frames) {
  const int64_t frame = kRate * 20 / 1000;
  std::vector<double> e;
  for (int64_t s = 0; s < frames; s += frame) {
    double sum = 0;
    for (int64_t i = s; i < std::min(frames, s + frame); ++i) sum += double(clean[size_t(i)]) * clean[size_t(i)];
    e.push_back(sum);
  }
  const double loudest = *std::max_element(e.begin(), e.end());
  std::vector<bool> active(static_cast<size_t>(frames), false);
  for (int64_t i = 0; i < frames; ++i) active[size_t(i)] = loudest > 0 && e[size_t(i / frame)] >= loudest * 1e-4;
  return active;
}

/// Mean square of `x` over the active samples.
double active_mean_square(const std::vector<double>& x, const std::vector<bool>& active) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    if (!active[i]) continue;
    sum += x[i] * x[i];
    ++n;
  }
  return sum / static_cast<double>(n);
}

/// y[n] = sum_k h'[k] x[n + d - k], h' = h / |h|, d = argmax |h|, in double.
std::vector<double> naive_reverb(const std::vector<float>& x, const std::vector<float>& h) {
  double energy = 0;
  size_t d = 0;
  for (size_t k = 0; k < h.size(); ++k) {
    energy += double(h[k]) * h[k];
    if (std::fabs(h[k]) > std::fabs(h[d])) d = k;
  }
  const double scale = 1.0 / std::sqrt(energy);
  const auto frames = static_cast<int64_t>(x.size());
  std::vector<double> y(x.size(), 0.0);
  for (int64_t n = 0; n < frames; ++n) {
    double sum = 0;
    for (int64_t k = 0; k < static_cast<int64_t>(h.size()); ++k) {
      const int64_t j = n + static_cast<int64_t>(d) - k;
      if (j >= 0 && j < frames) sum += double(h[size_t(k)]) * scale * x[size_t(j)];
    }
    y[size_t(n)] = sum;
  }
  return y;
}

/// A decaying random impulse response of `len` taps with its largest tap at `direct`.
std::vector<float> make_rir(int64_t len, int64_t direct, uint32_t seed) {
  auto h = random_signal(len, seed, 0.2f);
  for (int64_t k = 0; k < len; ++k) h[size_t(k)] *= static_cast<float>(std::exp(-3.0 * k / double(len)));
  h[size_t(direct)] = 2.0f;
  return h;
}

/// Runs `recipe` on a copy of `clean` (with `pad` zeros after it) through `augmenter`.
std::vector<float> run(aug::Augmenter& augmenter, const aug::Recipe& recipe, const std::vector<float>& clean,
                       int64_t pad = 0) {
  std::vector<float> buf(clean);
  buf.resize(clean.size() + size_t(pad), 0.0f);
  aug::Augmenter::Item item{recipe, buf, static_cast<int64_t>(clean.size())};
  augmenter.apply(std::span<aug::Augmenter::Item>(&item, 1));
  return buf;
}

/// `clean` (with `pad` zeros after it) reverberated with the impulse response `h` by a fresh CPU augmenter.
std::vector<float> reverberate(const std::vector<float>& h, const std::vector<float>& clean, int64_t pad = 0) {
  const aug::Bank rir = bank_of({h});
  auto augmenter = aug::make_cpu_augmenter(aug::Bank{}, rir, kRate);
  aug::Recipe r;
  r.copy = 1;
  r.rir = 0;
  return run(*augmenter, r, clean, pad);
}

/// Writes mono or interleaved float samples as a WAV.
void write_wav(const fs::path& path, const std::vector<float>& data, int rate, int channels = 1) {
  fs::create_directories(path.parent_path());
  SF_INFO info{};
  info.format = SF_FORMAT_WAV | SF_FORMAT_FLOAT;
  info.channels = channels;
  info.samplerate = rate;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  REQUIRE(f != nullptr);
  const auto frames = static_cast<sf_count_t>(data.size() / size_t(channels));
  REQUIRE(sf_writef_float(f, data.data(), frames) == frames);
  REQUIRE(sf_close(f) == 0);
}

std::vector<float> tone(int64_t n, double hz, int rate, float amp = 0.5f) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = amp * static_cast<float>(std::sin(2 * kPi * hz * i / rate));
  return x;
}

/// The frequency of a tone from its upward zero crossings between the first and the last.
double zero_crossing_hz(const std::vector<float>& x, int rate) {
  std::vector<double> ups;
  for (size_t i = 1000; i + 1000 < x.size(); ++i)
    if (x[i - 1] < 0 && x[i] >= 0) ups.push_back(double(i - 1) + x[i - 1] / double(x[i - 1] - x[i]));
  REQUIRE(ups.size() > 10);
  return double(ups.size() - 1) / ((ups.back() - ups.front()) / rate);
}

/// The InvalidArgument message of `fn`, or fails.
template <class F>
std::string invalid_argument_message(F&& fn) {
  try {
    fn();
  } catch (const melforge::InvalidArgument& e) {
    return e.what();
  }
  FAIL("no InvalidArgument thrown");
  return {};
}

}  // namespace

TEST_CASE("augment SNR: the measured SNR on the active signal equals the drawn SNR, noise looped", "[augment]") {
  const double snr = GENERATE(-5.0, 0.0, 10.0, 25.0);
  const int64_t frames = GENERATE(int64_t{12345}, int64_t{40000});
  const int64_t noise_len = GENERATE(int64_t{3001}, int64_t{70000});
  const auto clean = gappy_signal(frames);
  const aug::Bank noise = bank_of({random_signal(noise_len, 7, 0.3f)});
  const aug::Bank rir;
  auto augmenter = aug::make_cpu_augmenter(noise, rir, kRate);
  aug::Recipe r;
  r.copy = 1;
  r.noise = 0;
  r.noise_offset = noise_len * 2 / 3;
  r.snr_db = snr;
  const auto mixed = run(*augmenter, r, clean, 77);
  CAPTURE(snr, frames, noise_len);

  const auto active = naive_active(clean, frames);
  const std::vector<double> s(clean.begin(), clean.end());
  std::vector<double> n(static_cast<size_t>(frames)), raw(static_cast<size_t>(frames));
  const auto& clip = noise.clips[0].samples;
  for (int64_t i = 0; i < frames; ++i) {
    n[size_t(i)] = double(mixed[size_t(i)]) - clean[size_t(i)];
    raw[size_t(i)] = clip[size_t((r.noise_offset + i) % noise_len)];
  }
  const double measured = 10 * std::log10(active_mean_square(s, active) / active_mean_square(n, active));
  CHECK(std::fabs(measured - snr) < 0.1);

  const auto factor = static_cast<float>(std::sqrt(active_mean_square(s, active) /
                                                   (active_mean_square(raw, active) * std::pow(10.0, snr / 10))));
  for (int64_t i = 0; i < frames; i += 97)
    REQUIRE(mixed[size_t(i)] == Approx(clean[size_t(i)] + factor * float(raw[size_t(i)])).margin(1e-5));
  for (size_t i = size_t(frames); i < mixed.size(); ++i) REQUIRE(mixed[i] == 0.0f);

  const auto power = aug::active_power(clean, clip, r.noise_offset, kRate);
  CHECK(power.active_samples == std::count(active.begin(), active.end(), true));
}

TEST_CASE("augment SNR: silence gets no noise and a silent clip adds nothing", "[augment]") {
  const std::vector<float> silence(5000, 0.0f);
  const aug::Bank noise = bank_of({random_signal(1000, 3), std::vector<float>(800, 0.0f)});
  auto augmenter = aug::make_cpu_augmenter(noise, aug::Bank{}, kRate);
  aug::Recipe r;
  r.copy = 1;
  r.noise = 0;
  r.snr_db = 10;
  CHECK(run(*augmenter, r, silence) == silence);
  const auto clean = random_signal(5000, 4);
  r.noise = 1;
  CHECK(run(*augmenter, r, clean) == clean);
  CHECK(aug::noise_factor(aug::ActivePower{}, 10.0) == 0.0);
}

TEST_CASE("augment reverberation: the FFT convolution equals a naive direct convolution", "[augment]") {
  const int64_t len = GENERATE(int64_t{1}, int64_t{300}, int64_t{2049}, int64_t{5000});
  const int64_t hop = aug::ola_hop(len);
  const int64_t frames = GENERATE_COPY(int64_t{50}, hop - 1, hop, hop + 1, 2 * hop + 17);
  const int64_t direct = len / 3;
  CAPTURE(len, hop, frames, direct);
  const auto h = make_rir(len, direct, 11);
  const auto clean = random_signal(frames, 12);
  const auto out = reverberate(h, clean, 33);
  const auto ref = naive_reverb(clean, h);
  double peak = 0;
  for (double v : ref) peak = std::max(peak, std::fabs(v));
  double worst = 0;
  for (int64_t i = 0; i < frames; ++i) worst = std::max(worst, std::fabs(out[size_t(i)] - ref[size_t(i)]));
  CAPTURE(worst, peak);
  CHECK(worst <= 1e-5 * peak);
  for (size_t i = size_t(frames); i < out.size(); ++i) REQUIRE(out[i] == 0.0f);

  std::vector<float> loud(h);
  for (auto& v : loud) v *= 7.5f;
  const auto out_loud = reverberate(loud, clean);
  for (int64_t i = 0; i < frames; ++i) REQUIRE(out_loud[size_t(i)] == Approx(out[size_t(i)]).margin(1e-5 * peak));
}

TEST_CASE("augment reverberation: a delayed spike returns the signal (direct-path alignment)", "[augment]") {
  const int64_t len = GENERATE(int64_t{64}, int64_t{4000});
  const int64_t delay = GENERATE_COPY(int64_t{0}, int64_t{37}, len - 1);
  const int64_t frames = 9000;
  CAPTURE(len, delay);
  std::vector<float> h(size_t(len), 0.0f);
  h[size_t(delay)] = 0.25f;
  const auto clean = random_signal(frames, 5);
  const auto out = reverberate(h, clean);
  for (int64_t i = 0; i < frames; ++i) REQUIRE(out[size_t(i)] == Approx(clean[size_t(i)]).margin(2e-6));
}

TEST_CASE("augment gain is exact, the identity is bit-identical, samples past frames stay zero", "[augment]") {
  const double gain = GENERATE(-6.0, 3.5, 20.0);
  const auto clean = random_signal(7000, 21);
  const aug::Bank noise = bank_of({random_signal(500, 22)});
  const aug::Bank rir = bank_of({make_rir(800, 10, 23)});
  auto augmenter = aug::make_cpu_augmenter(noise, rir, kRate);
  aug::Recipe r;
  r.copy = 1;
  r.gain_db = gain;
  const auto out = run(*augmenter, r, clean, 50);
  const auto amp = static_cast<float>(std::pow(10.0, gain / 20.0));
  for (size_t i = 0; i < clean.size(); ++i) REQUIRE(out[i] == clean[i] * amp);

  const aug::Recipe identity;
  const auto same = run(*augmenter, identity, clean, 50);
  REQUIRE(std::memcmp(same.data(), clean.data(), clean.size() * sizeof(float)) == 0);

  r.rir = 0;
  r.noise = 0;
  r.snr_db = 5;
  const auto all = run(*augmenter, r, clean, 50);
  for (size_t i = clean.size(); i < all.size(); ++i) REQUIRE(all[i] == 0.0f);
}

namespace {

aug::AugmentArgs recipe_args() {
  aug::AugmentArgs a;
  a.copies = 4;
  a.speed = "0.9,1.0,1.1";
  a.snr_db = "0,15";
  a.gain_db = "-6,6";
  a.noise_prob = 0.7;
  a.rir_prob = 0.5;
  return a;
}

bool same(const aug::Recipe& a, const aug::Recipe& b) {
  return a.copy == b.copy && a.speed == b.speed && a.rir == b.rir && a.noise == b.noise &&
         a.noise_offset == b.noise_offset && a.snr_db == b.snr_db && a.gain_db == b.gain_db;
}

}  // namespace

TEST_CASE("augment recipe: deterministic, varied, within its ranges", "[augment]") {
  const auto args = recipe_args();
  const aug::Bank noise = bank_of({std::vector<float>(100, 0.1f), std::vector<float>(3000, 0.1f)});
  const aug::Bank rir = bank_of({std::vector<float>(10, 0.1f), std::vector<float>(20, 0.1f)});
  CHECK(aug::draw_recipe(args, noise, rir, 1, "a/b.wav", 0).identity());
  const auto r1 = aug::draw_recipe(args, noise, rir, 1, "a/b.wav", 1);
  CHECK(same(r1, aug::draw_recipe(args, noise, rir, 1, "a/b.wav", 1)));
  CHECK(r1.copy == 1);
  int differ_copy = 0, differ_path = 0, differ_seed = 0;
  std::map<double, int> speeds;
  for (int i = 0; i < 2000; ++i) {
    const std::string path = "class/file" + std::to_string(i) + ".wav";
    const auto r = aug::draw_recipe(args, noise, rir, 42, path, 1 + i % 4);
    differ_copy += !same(r, aug::draw_recipe(args, noise, rir, 42, path, 1 + (i + 1) % 4));
    differ_seed += !same(r, aug::draw_recipe(args, noise, rir, 43, path, 1 + i % 4));
    differ_path += !same(r, aug::draw_recipe(args, noise, rir, 42, path + "x", 1 + i % 4));
    ++speeds[r.speed];
    REQUIRE((r.speed == 0.9 || r.speed == 1.0 || r.speed == 1.1));
    REQUIRE((r.rir >= -1 && r.rir < 2));
    REQUIRE((r.noise >= -1 && r.noise < 2));
    REQUIRE((r.gain_db >= -6 && r.gain_db <= 6));
    if (r.noise >= 0) {
      REQUIRE((r.snr_db >= 0 && r.snr_db <= 15));
      REQUIRE((r.noise_offset >= 0 && r.noise_offset < int64_t(noise.clips[size_t(r.noise)].samples.size())));
    } else {
      REQUIRE((r.snr_db == 0.0 && r.noise_offset == 0));
    }
  }
  CHECK(differ_copy == 2000);
  CHECK(differ_seed == 2000);
  CHECK(differ_path == 2000);
  CHECK(speeds.size() == 3);
  for (const auto& [s, count] : speeds) CHECK(std::abs(count - 667) < 100);
}

TEST_CASE("augment recipe: probabilities 0 and 1 are honoured", "[augment]") {
  auto args = recipe_args();
  const double p = GENERATE(0.0, 1.0);
  args.noise_prob = p;
  args.rir_prob = 1.0 - p;
  const aug::Bank noise = bank_of({std::vector<float>(100, 0.1f)});
  const aug::Bank rir = bank_of({std::vector<float>(10, 0.1f)});
  for (int i = 0; i < 500; ++i) {
    const auto r = aug::draw_recipe(args, noise, rir, 3, "f" + std::to_string(i), 2);
    REQUIRE((r.noise >= 0) == (p == 1.0));
    REQUIRE((r.rir >= 0) == (p == 0.0));
  }
  const auto none = aug::draw_recipe(args, aug::Bank{}, aug::Bank{}, 3, "f", 2);
  CHECK((none.noise == -1 && none.rir == -1));
}

TEST_CASE("augment recipe: group weights are honoured, gain changes leave the other draws", "[augment]") {
  auto args = recipe_args();
  args.noise_prob = 1.0;
  args.noise_weights = "noise:1,music:3";
  const aug::Bank noise = bank_of({std::vector<float>(100, 0.1f), std::vector<float>(200, 0.1f),
                                   std::vector<float>(300, 0.1f), std::vector<float>(400, 0.1f),
                                   std::vector<float>(500, 0.1f)},
                                  {"music", "noise", "noise", "noise", "speech"});
  const aug::Bank rir = bank_of({std::vector<float>(10, 0.1f), std::vector<float>(20, 0.1f)});
  std::map<std::string, int> groups;
  auto louder = args;
  louder.gain_db = "10,20";
  const int draws = 4000;
  for (int i = 0; i < draws; ++i) {
    const std::string path = "x/" + std::to_string(i);
    const auto r = aug::draw_recipe(args, noise, rir, 9, path, 1);
    REQUIRE(r.noise >= 0);
    ++groups[noise.clips[size_t(r.noise)].group];
    auto other = aug::draw_recipe(louder, noise, rir, 9, path, 1);
    REQUIRE((other.gain_db >= 10 && other.gain_db <= 20));
    other.gain_db = r.gain_db;
    REQUIRE(same(r, other));
  }
  CHECK(groups["speech"] == 0);
  CHECK(std::abs(groups["music"] / double(draws) - 0.75) < 0.03);
  CHECK(std::abs(groups["noise"] / double(draws) - 0.25) < 0.03);

  args.noise_weights = "noise:1,wind:2";
  CHECK(invalid_argument_message([&] { aug::draw_recipe(args, noise, rir, 9, "p", 1); }).find("wind") !=
        std::string::npos);
}

TEST_CASE("augment speed: decoded at speed_decode_rate, length scales by 1/s and pitch by s", "[augment]") {
  const double speed = GENERATE(0.9, 1.1);
  TempDir dir;
  const fs::path wav = dir / "tone.wav";
  const int64_t frames = 2 * kRate;
  const double hz = 440.0;
  write_wav(wav, tone(frames, hz, kRate), kRate);
  const int rate = aug::speed_decode_rate(kRate, speed);
  CHECK(rate == int(std::lround(kRate / speed)));
  const auto decoded = melforge::audio::decode(wav, {rate, -1});
  CAPTURE(speed, rate, decoded.samples.size());
  CHECK(std::fabs(double(decoded.samples.size()) - frames / speed) <= 2.0 + frames * 1e-4);
  const double measured = zero_crossing_hz(decoded.samples, kRate);
  CHECK(measured == Approx(hz * speed).epsilon(0.002));
  CHECK(aug::speed_decode_rate(kRate, 1.0) == kRate);
}

TEST_CASE("augment banks: recursive, sorted, grouped, mono at the build's rate, sized from the headers",
          "[augment]") {
  TempDir dir;
  const auto t = tone(8000, 300, kRate);
  std::vector<float> stereo;
  for (float v : t) {
    stereo.push_back(v);
    stereo.push_back(0.5f * v);
  }
  write_wav(dir / "noise/b.wav", stereo, kRate, 2);
  write_wav(dir / "noise/a.WAV", tone(4000, 200, 8000), 8000);
  write_wav(dir / "music/deep/m.wav", t, kRate);
  write_wav(dir / "x.wav", t, kRate);
  write_wav(dir / ".hidden.wav", t, kRate);
  write_wav(dir / "noise/.skip/y.wav", t, kRate);
  melforge::test::write_text(dir / "noise/notes.txt", "not audio");
  const std::vector<std::string> exts{"wav", "flac"};
  const aug::Bank bank = aug::load_bank(dir.path(), kRate, exts, 2, "--noise");
  REQUIRE(bank.clips.size() == 4);
  CHECK(bank.clips[0].path == "music/deep/m.wav");
  CHECK(bank.clips[1].path == "noise/a.WAV");
  CHECK(bank.clips[2].path == "noise/b.wav");
  CHECK(bank.clips[3].path == "x.wav");
  CHECK(bank.clips[0].group == "music");
  CHECK(bank.clips[1].group == "noise");
  CHECK(bank.clips[3].group == ".");
  CHECK(bank.clips[1].samples.size() == 8000);
  const auto& mono = bank.clips[2].samples;
  REQUIRE(mono.size() == t.size());
  for (size_t i = 0; i < t.size(); ++i) REQUIRE(mono[i] == Approx(0.75f * t[i]).margin(1e-7));
  const int64_t bytes = aug::bank_bytes(dir.path(), kRate, exts, "--noise");
  CHECK(std::abs(bytes - bank.bytes()) <= 4 * int64_t(bank.clips.size()));
  CHECK(bank.bytes() == int64_t(4 * (8000 + 8000 + 8000 + 8000)));
  CHECK(aug::load_bank({}, kRate, exts, 1, "--noise").empty());

  melforge::test::write_text(dir / "noise/bad.wav", "RIFF garbage, not a wave file at all");
  for (const auto& message :
       {invalid_argument_message([&] { aug::load_bank(dir.path(), kRate, exts, 2, "--rir"); }),
        invalid_argument_message([&] { aug::bank_bytes(dir.path(), kRate, exts, "--rir"); })}) {
    CAPTURE(message);
    CHECK(message.find("--rir") != std::string::npos);
    CHECK(message.find("bad.wav") != std::string::npos);
  }
  const auto none = invalid_argument_message([&] { aug::load_bank(dir.path(), kRate, {"ogg"}, 1, "--noise"); });
  CHECK(none.find("--noise") != std::string::npos);
}

TEST_CASE("augment flags: validate refuses bad values naming the flag", "[augment]") {
  TempDir dir;
  struct Case {
    std::string flag;
    std::function<void(aug::AugmentArgs&)> change;
  };
  const fs::path folder = dir.path();
  const auto c = GENERATE_COPY(
      Case{"--augment-copies", [](aug::AugmentArgs& a) { a.copies = -1; }},
      Case{"--augment-copies", [](aug::AugmentArgs& a) { a.copies = 65; }},
      Case{"--augment-copies", [](aug::AugmentArgs& a) { a.speed = "1.0"; }},
      Case{"--snr-db", [](aug::AugmentArgs& a) { a.snr_db = "5"; }},
      Case{"--snr-db", [](aug::AugmentArgs& a) { a.snr_db = "20,5"; }},
      Case{"--snr-db", [](aug::AugmentArgs& a) { a.snr_db = "x,5"; }},
      Case{"--gain-db", [](aug::AugmentArgs& a) { a.gain_db = "-100,0"; }},
      Case{"--speed", [](aug::AugmentArgs& a) { a.speed = "0.3"; }},
      Case{"--speed", [](aug::AugmentArgs& a) { a.speed = "0.9,,1.1"; }},
      Case{"--augment-splits", [](aug::AugmentArgs& a) { a.splits = "train,foo"; }},
      Case{"--noise-prob", [](aug::AugmentArgs& a) { a.noise_prob = 1.5; }},
      Case{"--rir-prob", [](aug::AugmentArgs& a) { a.rir_prob = -0.1; }},
      Case{"--noise", [](aug::AugmentArgs& a) { a.noise = "/nonexistent/melforge/noise"; }},
      Case{"--rir", [](aug::AugmentArgs& a) { a.rir = "/nonexistent/melforge/rir"; }},
      Case{"--noise-weights", [folder](aug::AugmentArgs& a) { a.noise = folder, a.noise_weights = "noise"; }},
      Case{"--noise-weights", [folder](aug::AugmentArgs& a) { a.noise = folder, a.noise_weights = "noise:0"; }},
      Case{"--noise-weights", [](aug::AugmentArgs& a) { a.noise_weights = "noise:1"; }},
      Case{"--speed", [](aug::AugmentArgs& a) { a.copies = 0; }},
      Case{"--gain-db", [](aug::AugmentArgs& a) { a.copies = 0, a.speed = "1", a.gain_db = "-3,3"; }},
      Case{"--noise", [folder](aug::AugmentArgs& a) { a.copies = 0, a.speed = "1", a.noise = folder; }});
  aug::AugmentArgs args;
  args.copies = 2;
  args.speed = "0.9,1.1";
  REQUIRE_NOTHROW(args.validate());
  c.change(args);
  const auto message = invalid_argument_message([&] { args.validate(); });
  CAPTURE(c.flag, message);
  CHECK(message.rfind(c.flag + ":", 0) == 0);
}

TEST_CASE("augment flags: add_options parses every flag", "[augment]") {
  TempDir dir;
  namespace po = boost::program_options;
  aug::AugmentArgs args;
  po::options_description desc;
  aug::add_options(desc, args);
  const std::string folder = dir.path().string();
  const std::vector<std::string> argv{"--augment-copies", "3", "--augment-splits", "train,val", "--noise", folder,
                                      "--noise-weights", "noise:2", "--snr-db", "0,10", "--noise-prob", "0.5",
                                      "--rir", folder, "--rir-prob", "0.25", "--speed", "0.9,1.1",
                                      "--gain-db", "-3,3"};
  po::variables_map vm;
  po::store(po::command_line_parser(argv).options(desc).run(), vm);
  po::notify(vm);
  CHECK(args.copies == 3);
  CHECK(args.split_mask() == std::array<bool, 3>{true, true, false});
  CHECK(args.noise == dir.path());
  CHECK(args.rir == dir.path());
  CHECK(args.weight_list() == std::vector<std::pair<std::string, double>>{{"noise", 2.0}});
  CHECK(args.snr_range() == std::pair<double, double>{0.0, 10.0});
  CHECK(args.noise_prob == 0.5);
  CHECK(args.rir_prob == 0.25);
  CHECK(args.speed_list() == std::vector<double>{0.9, 1.1});
  CHECK(args.gain_range() == std::pair<double, double>{-3.0, 3.0});
  CHECK_NOTHROW(args.validate());

  aug::AugmentArgs defaults;
  po::options_description desc2;
  aug::add_options(desc2, defaults);
  po::variables_map vm2;
  po::store(po::command_line_parser(std::vector<std::string>{}).options(desc2).run(), vm2);
  po::notify(vm2);
  CHECK_FALSE(defaults.enabled());
  CHECK_NOTHROW(defaults.validate());
}

TEST_CASE("augment apply: several threads at once give the serial bytes", "[augment]") {
  const aug::Bank noise = bank_of({random_signal(3000, 31), random_signal(20000, 32)});
  const aug::Bank rir = bank_of({make_rir(500, 3, 33), make_rir(3000, 100, 34), make_rir(9000, 40, 35)});
  const int items = 12;
  std::vector<std::vector<float>> clean;
  std::vector<aug::Recipe> recipes;
  for (int i = 0; i < items; ++i) {
    clean.push_back(random_signal(5000 + 1700 * i, 40 + uint32_t(i)));
    aug::Recipe r;
    r.copy = 1;
    r.rir = i % 3;
    r.noise = i % 2;
    r.noise_offset = 17 * i;
    r.snr_db = 3 + i;
    r.gain_db = i % 4 - 2;
    recipes.push_back(r);
  }
  auto serial = aug::make_cpu_augmenter(noise, rir, kRate);
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < items; ++i) expected.push_back(run(*serial, recipes[size_t(i)], clean[size_t(i)], 10));
  auto shared = aug::make_cpu_augmenter(noise, rir, kRate);
  std::vector<std::vector<float>> got(items);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < items; i += 4) got[size_t(i)] = run(*shared, recipes[size_t(i)], clean[size_t(i)], 10);
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < items; ++i) {
    REQUIRE(got[size_t(i)].size() == expected[size_t(i)].size());
    REQUIRE(std::memcmp(got[size_t(i)].data(), expected[size_t(i)].data(), got[size_t(i)].size() * 4) == 0);
  }
  CHECK(shared->name() == "cpu-fftw");
  CHECK(shared->device_bytes() == 0);
  CHECK(shared->item_bytes(1000) > 0);
}

}  // namespace melforge_test_augment
