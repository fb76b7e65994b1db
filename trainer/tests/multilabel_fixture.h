#pragma once
// A tiny multi-label corpus for the trainer's tests: tone mixtures whose labels are the tones they hold.
#include <sndfile.h>

#include "catch_torch.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "trainer_fixture.h"

namespace melforge::test {

/// The tones of the mixture corpus: class name and frequency in Hz.
inline const std::vector<std::pair<std::string, double>>& mix_tones() {
  static const std::vector<std::pair<std::string, double>> tones = {{"high", 2400}, {"low", 350}, {"mid", 1100}};
  return tones;
}

/// Writes a 16-bit mono WAV at 8 kHz of `frames` frames: the sum of the tones whose bit is set in `mask` (bit k:
/// mix_tones()[k]), with a little deterministic noise.
inline void write_mix(const std::filesystem::path& path, unsigned mask, int64_t frames, uint32_t seed) {
  std::filesystem::create_directories(path.parent_path());
  SF_INFO info{};
  info.samplerate = 8000;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  REQUIRE(f != nullptr);
  std::vector<float> buf(static_cast<std::size_t>(frames));
  uint32_t lcg = seed;
  for (int64_t i = 0; i < frames; ++i) {
    lcg = lcg * 1664525u + 1013904223u;
    float v = (static_cast<float>(lcg >> 8) / 16777216.0f - 0.5f) * 0.04f;
    for (std::size_t k = 0; k < mix_tones().size(); ++k)
      if (mask & (1u << k))
        v += 0.25f * static_cast<float>(std::sin(2.0 * M_PI * mix_tones()[k].second * static_cast<double>(i) / 8000.0));
    buf[static_cast<std::size_t>(i)] = v;
  }
  sf_writef_float(f, buf.data(), frames);
  sf_close(f);
}

/// A multi-label corpus (every non-empty subset of the tones, `per_set` files each, splits 3:1:1 by file number:
/// `per_set` >= 5 gives every split files) written to `root`/in and built into `root`/data through the manifest
/// `root`/m.csv (paths relative to `root`); the first label of a row rotates so that stratification sees every class.
inline std::filesystem::path build_mix_dataset(const std::filesystem::path& root, int per_set) {
  const auto& tones = mix_tones();
  std::string manifest = "path,label,split\n";
  int n = 0;
  for (unsigned mask = 1; mask < 8; ++mask) {
    for (int i = 0; i < per_set; ++i, ++n) {
      const std::string name = "m" + std::to_string(mask) + "_" + std::to_string(i) + ".wav";
      write_mix(root / "in" / name, mask, 6000 + (n * 977) % 9000, 7u + static_cast<uint32_t>(n));
      std::vector<std::string> labels;
      for (std::size_t k = 0; k < tones.size(); ++k)
        if (mask & (1u << ((k + static_cast<std::size_t>(i)) % tones.size())))
          labels.push_back(tones[(k + static_cast<std::size_t>(i)) % tones.size()].first);
      std::string field;
      for (const auto& l : labels) field += (field.empty() ? "" : ";") + l;
      manifest += "in/" + name + "," + field + "," + (i % 5 == 3 ? "val" : i % 5 == 4 ? "test" : "train") + "\n";
    }
  }
  write_text(root / "m.csv", manifest);
  builder::BuildConfig c = tiny_build_config({}, root / "data");
  c.build.manifest = root / "m.csv";
  builder::run_build(c);
  return root / "data";
}

}  // namespace melforge::test
