// The engine check of issue 27 on a real GPU: a --device cuda build compares its first batch (and its first augmented
// batch) with the CPU twin and passes; the test hook's offset on the real device's result stops a cuda build and
// makes an auto build fall back to the CPU, whose result is then what a CPU build writes. Needs a CUDA device
// (catch_main_cuda exits 77 without one: CTest reports it skipped).
#include <catch2/catch.hpp>

#include <string>

#include "augment_build_fixture.h"
#include "build_fixture.h"
#include "engine_check.h"
#include "engine_check_fixture.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_engine_check_cuda {

using namespace melforge;
using melforge::test::require_same_splits;
using melforge::test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("a CUDA build passes its engine check and reports the comparison", "[cuda][engine_check][e2e]") {
  const mel::DType dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  auto c = test::tone_build_config(d / "in", d / "out");
  c.build.device = mel::Device::cuda;
  c.build.dtype = dtype;
  const auto report = builder::run_build(c).report;
  const auto& check = report["engine_check"];
  INFO(check.dump(2));
  CHECK(check["ran"] == true);
  CHECK(check["result"] == "passed");
  CHECK(check["engine"].get<std::string>().rfind("cuda-cufft", 0) == 0);
  CHECK(check["batches_compared"] == 1);
  CHECK(check["fallback"] == false);
  CHECK(check["max_abs_diff"].get<double>() >= 0);
  CHECK(report["engine"].get<std::string>().rfind("cuda-cufft", 0) == 0);
}

TEST_CASE("a CUDA build with augmentation compares the device augmenter with the CPU one and passes",
          "[cuda][engine_check][augment][e2e]") {
  using namespace melforge::test::augment_fixture;
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  write_banks(d / "banks");
  auto c = augment_config(d / "in", d / "banks", d / "out");
  c.build.device = mel::Device::cuda;
  const auto check = builder::run_build(c).report["engine_check"];
  INFO(check.dump(2));
  CHECK(check["result"] == "passed");
  CHECK(check["augmenter"] == "cuda-cufft");
  CHECK(check["augmented_compared"].get<int64_t>() > 0);
  CHECK(check["augment_max_abs_diff"].get<double>() >= 0);
}

TEST_CASE("a perturbed device result stops a cuda build and makes an auto build fall back to the CPU",
          "[cuda][engine_check][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  builder::run_build(test::tone_build_config(d / "in", d / "cpu"));
  auto c = test::tone_build_config(d / "in", d / "cuda");
  c.build.device = mel::Device::cuda;
  c.engine_check.fault.mel_offset = 6.0f;
  c.engine_check.fault.mel_element = 1234;
  CHECK_THROWS_AS(builder::run_build(c), builder::EngineCheckError);
  CHECK_FALSE(fs::exists(d / "cuda" / "train.h5"));
  c.build.device = mel::Device::auto_select;
  c.build.output = d / "auto";
  const auto report = builder::run_build(c).report;
  const auto& check = report["engine_check"];
  INFO(check.dump(2));
  CHECK(check["result"] == "failed");
  CHECK(check["fallback"] == true);
  CHECK(check["fallback_batch"] == 1);
  CHECK(check["where"]["stage"] == "mel");
  CHECK(report["engine"] == "cpu-fftw");
  require_same_splits(d / "cpu", d / "auto");
}

}  // namespace melforge_test_engine_check_cuda
