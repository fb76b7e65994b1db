// The resampler attributes and the per-file source_sample_rate dataset (docs/FORMAT.md) of a build, a sharded build
// merged with and without --copy, and a merge of shards written before source_sample_rate existed.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <map>
#include <string>
#include <vector>

#include "audio/decode.h"
#include "build_fixture.h"
#include "melforge/common/h5.h"
#include "test_util.h"

namespace melforge_test_source_rate {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// path -> source_sample_rate of one split file (an empty map when the dataset is absent).
std::map<std::string, int32_t> rates_of(const fs::path& file) {
  auto f = h5::open_file(file);
  if (!h5::exists(f, "source_sample_rate")) return {};
  const std::vector<std::string> paths = h5::read_strings(f, "path");
  const std::vector<int32_t> rates = h5::read_int32(f, "source_sample_rate");
  REQUIRE(rates.size() == paths.size());
  std::map<std::string, int32_t> out;
  for (std::size_t i = 0; i < paths.size(); ++i) out[paths[i]] = rates[i];
  return out;
}

/// The rate the tone corpus wrote each file at: stereo16k.wav at 16 kHz, the others at 8 kHz.
int32_t written_rate(const std::string& rel_path) {
  return rel_path.find("stereo16k") != std::string::npos ? 16000 : 8000;
}

void check_split_files(const fs::path& dir, std::size_t expected_files) {
  std::size_t files = 0;
  for (const std::string split : {"train", "val", "test"}) {
    CAPTURE(split);
    auto f = h5::open_file(dir / (split + ".h5"));
    CHECK(h5::read_attribute_string(f, "resampler") == "soxr");
    CHECK(h5::read_attribute_string(f, "resampler_quality") == "HQ");
    CHECK(h5::read_attribute_string(f, "resampler_phase") == "linear");
    CHECK(h5::read_attribute_string(f, "resampler_version") == audio::resampler_version());
    CHECK(h5::read_attribute_int64(f, "schema_version") == 3);
    f.close();
    const auto rates = rates_of(dir / (split + ".h5"));
    CHECK(rates.size() == test::read_split(dir / (split + ".h5")).path.size());
    for (const auto& [path, rate] : rates) {
      CAPTURE(path);
      CHECK(rate == written_rate(path));
    }
    files += rates.size();
  }
  CHECK(files == expected_files);
}

}  // namespace

TEST_CASE("a build records the resampler and each file's source sample rate", "[e2e][h5]") {
  TempDir d;
  const int n = test::write_tone_corpus(d / "in", 3, 4);
  builder::run_build(test::tone_build_config(d / "in", d / "out"));
  CHECK(audio::resampler_version().find("0.") != std::string::npos);
  check_split_files(d / "out", static_cast<std::size_t>(n));
}

TEST_CASE("a sharded build merges the source sample rates in order, virtual or copied", "[shard][e2e][h5]") {
  TempDir d;
  const int n = test::write_tone_corpus(d / "in", 3, 4);
  const auto dirs = test::build_shards(test::tone_build_config(d / "in", d / "unused"), d / "shards", 2);
  const bool copy = GENERATE(false, true);
  CAPTURE(copy);
  test::merge_shards(dirs, d / "merged", copy);
  check_split_files(d / "merged", static_cast<std::size_t>(n));
}

TEST_CASE("shards without source_sample_rate merge into a file without it", "[shard][e2e][h5]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const auto dirs = test::build_shards(test::tone_build_config(d / "in", d / "unused"), d / "shards", 2);
  for (const fs::path& dir : dirs)
    for (const std::string split : {"train", "val", "test"}) {
      auto f = h5::open_file(dir / (split + ".h5"), /*writable=*/true);
      REQUIRE(H5Ldelete(f.id(), "source_sample_rate", H5P_DEFAULT) >= 0);
    }
  const bool copy = GENERATE(false, true);
  CAPTURE(copy);
  test::merge_shards(dirs, d / "merged", copy);
  for (const std::string split : {"train", "val", "test"}) {
    CAPTURE(split);
    auto f = h5::open_file(d / "merged" / (split + ".h5"));
    CHECK_FALSE(h5::exists(f, "source_sample_rate"));
    CHECK(h5::read_attribute_string(f, "resampler") == "soxr");
  }
}

}  // namespace melforge_test_source_rate
