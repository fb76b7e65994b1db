// A build with --augment-copies on the CUDA engine augments on the device (make_cuda_augmenter) and writes what the
// CPU build writes: the same rows and recipes, the clean rows within the mel engines' bound, the augmented rows
// close. Needs a CUDA device (catch_main_cuda exits 77 without one: CTest reports it skipped).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "augment_build_fixture.h"
#include "build_fixture.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_augment_build_cuda {

using namespace melforge;
using namespace melforge::test::augment_fixture;
using melforge::test::TempDir;

TEST_CASE("a CUDA build augments on the device and writes the rows and recipes of the CPU build",
          "[cuda][augment][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  write_banks(d / "banks");
  auto cpu = augment_config(d / "in", d / "banks", d / "cpu");
  auto cuda = augment_config(d / "in", d / "banks", d / "cuda");
  cuda.build.device = mel::Device::cuda;
  builder::run_build(cpu);
  const auto r = builder::run_build(cuda).report;
  CHECK(r["augmentation"]["augmenter"] == "cuda-cufft");
  CHECK(r["augmentation"]["device_bytes"].get<int64_t>() > 0);
  const Built a = read_build(d / "cpu");
  const Built b = read_build(d / "cuda");
  for (const std::string split : {"train", "val", "test"}) {
    INFO(split);
    const auto& x = a.splits.at(split);
    const auto& y = b.splits.at(split);
    REQUIRE(x.frames.size() == y.frames.size());
    CHECK(x.clips.frame_offset == y.clips.frame_offset);
    CHECK(x.path == y.path);
    CHECK(same_recipes(a.recipes.at(split), b.recipes.at(split)));
    const auto& copy = a.recipes.at(split).copy;
    double clean_excess = -1, augmented_sum = 0, augmented_max = 0;
    std::size_t augmented_n = 0;
    for (std::size_t row = 0; row < copy.size(); ++row) {
      const std::vector<float> xs = x.clip(row);
      const std::vector<float> ys = y.clip(row);
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const double diff = std::abs(static_cast<double>(xs[i]) - ys[i]);
        if (copy[row] == 0) {
          clean_excess = std::max(clean_excess, diff - (2e-4 * std::abs(xs[i]) + 5e-3));
        } else {
          augmented_sum += diff;
          augmented_max = std::max(augmented_max, diff);
          ++augmented_n;
        }
      }
    }
    CHECK(clean_excess <= 0);
    if (augmented_n > 0) {
      CHECK(augmented_sum / static_cast<double>(augmented_n) <= 0.05);
      CHECK(augmented_max <= 1.0);
    }
  }
}

}  // namespace melforge_test_augment_build_cuda
