#pragma once
// Banks, configuration and readers for the builds with waveform augmentation of test_augment_build.cpp and
// test_augment_build_cuda.cpp.
#include <catch2/catch.hpp>
#include <sndfile.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "build_fixture.h"
#include "h5_writer.h"
#include "melforge/common/h5.h"

namespace melforge::test::augment_fixture {

namespace fs = std::filesystem;

/// A noise bank (two groups of tones at odd pitches, different lengths) and an RIR bank (two decaying impulse
/// responses with their direct path after a few taps) under `root`.
inline void write_banks(const fs::path& root) {
  test::write_tone(root / "noise/music/a.wav", 1234.5, 3000, 8000);
  test::write_tone(root / "noise/speech/b.wav", 777.0, 9000, 16000);
  test::write_tone(root / "noise/c.wav", 2222.0, 20000, 8000);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> h(400 + 300 * r, 0.0f);
    uint32_t lcg = 99u + r;
    for (std::size_t i = 5; i < h.size(); ++i) {
      lcg = lcg * 1664525u + 1013904223u;
      h[i] = std::exp(-static_cast<float>(i) / (60.0f + 40 * r)) * (static_cast<float>(lcg >> 8) / 16777216.0f - 0.5f);
    }
    h[5 + r] = 1.0f;
    write_samples(root / "rir" / ("room" + std::to_string(r) + ".wav"), h, 8000);
  }
}

/// The tone build of `in` into `out` with `copies` augmented copies: noise, reverberation, speed and gain.
inline builder::BuildConfig augment_config(const fs::path& in, const fs::path& banks, const fs::path& out,
                                           int copies = 2) {
  auto c = test::tone_build_config(in, out);
  c.build.dtype = mel::DType::float32;
  c.augment.copies = copies;
  c.augment.noise = banks / "noise";
  c.augment.rir = banks / "rir";
  c.augment.rir_prob = 0.7;
  c.augment.noise_prob = 0.8;
  c.augment.speed = "0.9,1.0,1.1";
  c.augment.gain_db = "-6,3";
  return c;
}

/// The aug_* datasets of a split file.
inline builder::RecipeColumns read_recipes(const fs::path& file) {
  auto f = h5::open_file(file);
  builder::RecipeColumns c;
  REQUIRE(builder::read_recipe_columns(f, static_cast<std::size_t>(h5::dims(h5::open_dataset(f, "label"))[0]),
                                       file.string(), c));
  return c;
}

/// A build's rows of every split: mel and recipes.
struct Built {
  std::map<std::string, test::SplitData> splits;
  std::map<std::string, builder::RecipeColumns> recipes;
};

inline Built read_build(const fs::path& out, bool augmented = true) {
  Built b;
  for (const std::string split : {"train", "val", "test"}) {
    b.splits[split] = read_split(out / (split + ".h5"));
    if (augmented) b.recipes[split] = read_recipes(out / (split + ".h5"));
  }
  return b;
}

/// Float equality that treats two NaNs as equal.
inline bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

inline bool same_recipes(const builder::RecipeColumns& a, const builder::RecipeColumns& b) {
  if (a.size() != b.size() || a.copy != b.copy || a.rir != b.rir || a.noise != b.noise) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a.speed[i], b.speed[i]) || !same(a.snr_db[i], b.snr_db[i]) || !same(a.gain_db[i], b.gain_db[i]))
      return false;
  return true;
}

}  // namespace melforge::test::augment_fixture
