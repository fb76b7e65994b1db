// Waveform augmentation helps where it should (issue 18): a model trained on clean tones and tested on tones buried
// in band noise does clearly better when melforge-build added noisy copies of the training files (--augment-copies
// K --noise DIR, other recordings of the same kind of noise) than without. Both datasets are built through
// melforge-build's command line (parse_build_args, in process) and trained the same way through melforge-train's.
#include <sndfile.h>

#include <boost/program_options.hpp>
#include "catch_torch.h"
#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "build_cli.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_augment_helps {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kRate = 8000;
/// The classes: a tone each, Hz (every file jitters its frequency by up to 2%).
const std::vector<double> kTonesHz = {500, 850, 1400, 2200};

double rms(const std::vector<float>& x) {
  double s = 0;
  for (const float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s / static_cast<double>(std::max<std::size_t>(1, x.size())));
}

/// A recording of band noise, `frames` long, RMS 0.1: three resonances (two-pole filters of white noise) at random
/// centres between 300 and 2800 Hz, 80 to 300 Hz wide, over a weaker low-passed broadband floor. It overlaps the
/// tones' bands, so a model that only ever heard clean tones mistakes its peaks for tones.
std::vector<float> band_noise(int64_t frames, std::mt19937_64& rng) {
  std::normal_distribution<double> white(0.0, 1.0);
  std::uniform_real_distribution<double> centre(300.0, 2800.0), width(80.0, 300.0), weight(0.5, 1.0);
  std::vector<double> sum(static_cast<std::size_t>(frames), 0.0);
  for (int k = 0; k < 3; ++k) {
    const double r = std::exp(-M_PI * width(rng) / kRate), theta = 2.0 * M_PI * centre(rng) / kRate;
    std::vector<double> y(static_cast<std::size_t>(frames));
    double y1 = 0, y2 = 0, energy = 0;
    for (auto& v : y) {
      v = white(rng) + 2.0 * r * std::cos(theta) * y1 - r * r * y2;
      y2 = y1;
      y1 = v;
      energy += v * v;
    }
    const double g = weight(rng) / std::sqrt(energy / static_cast<double>(frames));
    for (std::size_t i = 0; i < y.size(); ++i) sum[i] += g * y[i];
  }
  double lp = 0;
  for (auto& v : sum) {
    lp = 0.8 * lp + white(rng);
    v += 0.15 * lp;
  }
  std::vector<float> out(sum.begin(), sum.end());
  const double g = 0.1 / rms(out);
  for (auto& v : out) v = static_cast<float>(v * g);
  return out;
}

/// A tone of class `c`, `frames` long: frequency jittered by up to 2%, random phase, amplitude 0.1 to 0.5.
std::vector<float> tone(std::size_t c, int64_t frames, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> jitter(-0.02, 0.02), phase(0.0, 2.0 * M_PI), amp(0.1, 0.5);
  const double hz = kTonesHz[c] * (1.0 + jitter(rng)), p = phase(rng), a = amp(rng);
  std::vector<float> x(static_cast<std::size_t>(frames));
  for (int64_t i = 0; i < frames; ++i)
    x[static_cast<std::size_t>(i)] =
        static_cast<float>(a * std::sin(2.0 * M_PI * hz * static_cast<double>(i) / kRate + p));
  return x;
}

/// `signal` plus `noise` (looped) scaled to `snr_db` below the signal's RMS.
std::vector<float> mixed(std::vector<float> signal, const std::vector<float>& noise, double snr_db) {
  const double g = rms(signal) / (rms(noise) * std::pow(10.0, snr_db / 20.0));
  for (std::size_t i = 0; i < signal.size(); ++i) signal[i] += static_cast<float>(g * noise[i % noise.size()]);
  return signal;
}

/// The corpus under `root`: `noise/` (noise recordings for --noise), `in/` (clean train and val tones, test tones
/// mixed with other recordings of the same noise at -4 to 2 dB SNR) and `m.csv`, the manifest with explicit splits.
void write_corpus(const fs::path& root, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> length(kRate, 2 * kRate);
  std::uniform_real_distribution<double> test_snr(-4.0, 2.0);
  for (int i = 0; i < 6; ++i)
    test::write_samples(root / "noise" / ("n" + std::to_string(i) + ".wav"), band_noise(4 * kRate, rng), kRate);
  std::vector<std::vector<float>> test_noise;
  for (int i = 0; i < 6; ++i) test_noise.push_back(band_noise(4 * kRate, rng));
  std::string manifest = "path,label,split\n";
  const std::vector<std::pair<std::string, int>> splits = {{"train", 10}, {"val", 4}, {"test", 12}};
  for (std::size_t c = 0; c < kTonesHz.size(); ++c)
    for (const auto& [split, n] : splits)
      for (int i = 0; i < n; ++i) {
        const std::string name = "in/" + split + "/c" + std::to_string(c) + "_" + std::to_string(i) + ".wav";
        std::vector<float> x = tone(c, length(rng), rng);
        if (split == "test") {
          const std::size_t which = rng() % test_noise.size();
          const double snr = test_snr(rng);
          x = mixed(std::move(x), test_noise[which], snr);
        }
        test::write_samples(root / name, x, kRate);
        manifest += name + ",tone" + std::to_string(c) + "," + split + "\n";
      }
  test::write_text(root / "m.csv", manifest);
}

/// Builds the corpus at `root` into `root`/`name` through melforge-build's flags, with `extra` flags added.
fs::path build(const fs::path& root, const std::string& name, const std::vector<std::string>& extra) {
  builder::BuildConfig config;
  std::string config_file;
  boost::program_options::options_description all;
  builder::add_build_groups(all, config, config_file);
  std::vector<std::string> args = {"--manifest", (root / "m.csv").string(), "--output", (root / name).string(),
                                   "--sample-rate", "8000", "--n-fft", "256", "--win-length", "256",
                                   "--hop-length", "64", "--n-mels", "32",
                                   "--short-seconds", "0.25", "--device", "cpu",
                                   "--threads", "2", "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::ostringstream help;
  REQUIRE(builder::parse_build_args(args, all, help));
  builder::run_build(config);
  return root / name;
}

/// Segment and file accuracy on the noisy test split after `epochs` epochs of the tiny model on `data`.
std::pair<double, double> test_accuracy(const fs::path& data, const fs::path& run, int64_t epochs) {
  auto c = test::tiny_config(data, run, epochs);
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  return {r.test->segment.accuracy, r.test->file.accuracy};
}

}  // namespace

TEST_CASE("noisy copies from --augment-copies --noise make a clean-tone model robust to band noise",
          "[trainer][augment][slow]") {
  // Seeds 1, 2 and 3 were measured (closing note of issue 18: 0.375/0.25/0.25 without, 0.875/0.875/0.79 with, by
  // file); CI runs the one with the smallest gap, about 80 s.
  const uint64_t seed = GENERATE(3);
  CAPTURE(seed);
  TempDir d;
  write_corpus(d.path(), seed);
  const fs::path plain = build(d.path(), "plain", {});
  const fs::path augmented = build(d.path(), "augmented", {"--augment-copies", "4", "--noise", (d / "noise").string(),
                                                           "--snr-db=-6,6", "--seed", std::to_string(seed)});
  const int64_t epochs = 8;
  const auto [without, without_files] = test_accuracy(plain, d / "run-plain", epochs);
  const auto [with, with_files] = test_accuracy(augmented, d / "run-augmented", epochs);
  std::cout << "augment helps (seed " << seed << "): noisy test accuracy without augmentation " << without
            << " (files " << without_files << "), with --augment-copies 4 --noise " << with << " (files "
            << with_files << ")\n";
  CAPTURE(without, with, without_files, with_files);
  CHECK(with >= without + 0.2);
  CHECK(with >= 0.7);
}

}  // namespace melforge_test_trainer_augment_helps
