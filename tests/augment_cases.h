#pragma once
/// Test fixtures shared by the CUDA augmenter's tests (test_augment_cuda.cpp on a device, test_augment_cuda_host.cpp
/// through the kernel bodies on the CPU): banks of synthetic clips, batches of items with mixed recipes, and the
/// comparison against the CPU augmenter within kCudaAbsTolerance.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "augment/augment.h"
#include "augment/augment_math.h"

namespace melforge::test {

/// A tone plus noise with a silent stretch in the middle (so that active_power has inactive frames), `n` samples.
inline std::vector<float> augment_signal(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> jitter(-0.05f, 0.05f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const bool silent = i > n / 3 && i < n / 2;
    const double t = static_cast<double>(i);
    x[static_cast<size_t>(i)] = silent ? 0.0f : static_cast<float>(0.4 * std::sin(0.031 * t)) + jitter(rng);
  }
  return x;
}

/// A decaying random impulse response of `taps` taps whose largest tap is at `peak` (< taps).
inline std::vector<float> augment_rir(int64_t taps, int64_t peak, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(taps));
  for (int64_t k = 0; k < taps; ++k) {
    h[static_cast<size_t>(k)] = 0.3f * g(rng) * std::exp(-3.0f * static_cast<float>(k) / static_cast<float>(taps));
  }
  h[static_cast<size_t>(peak)] = 2.0f;
  return h;
}

/// A bank of clips of the given lengths, made by `make(length, index)`.
template <class Make>
augment::Bank augment_bank(const std::vector<int64_t>& lengths, Make make) {
  augment::Bank bank;
  for (size_t i = 0; i < lengths.size(); ++i) {
    augment::Clip c;
    c.path = "clip" + std::to_string(i) + ".wav";
    c.group = ".";
    c.samples = make(lengths[i], i);
    bank.clips.push_back(std::move(c));
  }
  return bank;
}

/// Noise clips: white noise of 2000 (shorter than most signals: looped) and 50000 samples.
inline augment::Bank augment_noise_bank() {
  return augment_bank({2000, 50000}, [](int64_t n, size_t i) {
    std::mt19937 rng(static_cast<unsigned>(100 + i));
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& s : v) s = u(rng);
    return v;
  });
}

/// Impulse-response clips of `lengths` taps, peaks at a third of each.
inline augment::Bank augment_rir_bank(const std::vector<int64_t>& lengths) {
  return augment_bank(lengths, [](int64_t n, size_t i) { return augment_rir(n, n / 3, static_cast<unsigned>(7 + i)); });
}

/// One item's recipe and signal of a batch.
struct AugmentCase {
  augment::Recipe recipe;
  int64_t frames = 0;
  int64_t slack = 0;
  unsigned seed = 0;
};

/// A batch: per case a buffer of frames + slack samples (slack zeros past frames), spans into `storage`.
struct AugmentBatch {
  std::vector<std::vector<float>> storage;
  std::vector<augment::Augmenter::Item> items;
  /// Sum of the buffers' sizes.
  int64_t samples = 0;
};

inline AugmentBatch augment_batch(const std::vector<AugmentCase>& cases) {
  AugmentBatch b;
  for (const AugmentCase& c : cases) {
    std::vector<float> buf = augment_signal(c.frames, c.seed);
    buf.resize(static_cast<size_t>(c.frames + c.slack), 0.0f);
    b.storage.push_back(std::move(buf));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    augment::Augmenter::Item item;
    item.recipe = cases[i].recipe;
    item.samples = b.storage[i];
    item.frames = cases[i].frames;
    b.items.push_back(item);
    b.samples += static_cast<int64_t>(b.storage[i].size());
  }
  return b;
}

/// A recipe of the given parts (-1: none).
inline augment::Recipe augment_recipe(int rir, int noise, int64_t noise_offset, double snr_db, double gain_db) {
  augment::Recipe r;
  r.copy = 1;
  r.rir = rir;
  r.noise = noise;
  r.noise_offset = noise_offset;
  r.snr_db = noise >= 0 ? snr_db : 0.0;
  r.gain_db = gain_db;
  return r;
}

/// A mixed batch for one signal length, impulse response (index into a bank), SNR and gain: reverberation, noise and
/// gain together; each alone; an identity; a short item; the noise read from near the end of a clip (looped).
inline std::vector<AugmentCase> augment_cases(int64_t frames, int rir, double snr_db, double gain_db) {
  return {
      {augment_recipe(rir, 1, 123, snr_db, gain_db), frames, 7, 1},
      {augment_recipe(rir, -1, 0, 0.0, 0.0), frames + 13, 0, 2},
      {augment_recipe(-1, 0, 1990, snr_db, 0.0), frames, 3, 3},
      {augment_recipe(-1, -1, 0, 0.0, gain_db == 0.0 ? -3.0 : gain_db), frames / 2 + 1, 5, 4},
      {augment::Recipe{}, frames, 9, 5},
      {augment_recipe(rir, 0, 5, snr_db, gain_db), 17, 2, 6},
  };
}

/// Checks `got` against the CPU augmenter's `want`, item by item: within kCudaAbsTolerance * max|want| over
/// [0, frames), and exactly the input past frames and for items that do no work (`clean`: the inputs).
inline void require_augment_close(const AugmentBatch& got, const AugmentBatch& want, const AugmentBatch& clean) {
  REQUIRE(got.items.size() == want.items.size());
  for (size_t i = 0; i < got.items.size(); ++i) {
    const augment::Augmenter::Item& w = want.items[i];
    double scale = 0.0;
    for (int64_t t = 0; t < w.frames; ++t) scale = std::max(scale, std::abs(static_cast<double>(w.samples[t])));
    const double tol = augment::kCudaAbsTolerance * scale;
    double worst = 0.0;
    for (int64_t t = 0; t < w.frames; ++t) {
      const double d = std::abs(static_cast<double>(got.items[i].samples[t]) - w.samples[t]);
      REQUIRE_FALSE(std::isnan(got.items[i].samples[t]));
      worst = std::max(worst, d);
    }
    INFO("item " << i << ": " << w.frames << " frames, rir " << w.recipe.rir << ", noise " << w.recipe.noise
                  << ", gain " << w.recipe.gain_db << " dB: largest difference " << worst << ", tolerance " << tol);
    CHECK(worst <= tol);
    const bool untouched = w.recipe.rir < 0 && w.recipe.noise < 0 && w.recipe.gain_db == 0.0;
    const int64_t from = untouched ? 0 : w.frames;
    for (size_t t = static_cast<size_t>(from); t < w.samples.size(); ++t) {
      REQUIRE(got.items[i].samples[t] == clean.items[i].samples[t]);
    }
  }
}

/// Builds the batch of `cases` three times (the input, the CPU augmenter's output, and `run`'s), runs `run(batch)`
/// on one (it applies the augmenter under test to batch.items) and the CPU augmenter over `noise` and `rirs` at
/// `sample_rate` on another, and compares them with require_augment_close.
template <class Run>
void compare_with_cpu(const augment::Bank& noise, const augment::Bank& rirs, int sample_rate,
                      const std::vector<AugmentCase>& cases, Run run) {
  AugmentBatch want = augment_batch(cases);
  AugmentBatch got = augment_batch(cases);
  const AugmentBatch clean = augment_batch(cases);
  augment::make_cpu_augmenter(noise, rirs, sample_rate)->apply(want.items);
  run(got);
  require_augment_close(got, want, clean);
}

}  // namespace melforge::test
