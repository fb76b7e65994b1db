// Resource bounds of melforge-build (issues 5 and 15): peak RSS within --max-ram plus a fixed overhead on a corpus
// bigger than the limit, with one file larger than the limit, with hour-long files and with files whose header claims
// 1,024 channels; thread counts that follow --threads, capped at 4 per core.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <omp.h>

#include <cmath>
#include <map>

#include "build_fixture.h"
#include "melforge/common/h5.h"
#include "reliability/child_process.h"
#include "reliability/corpus.h"
#include "test_util.h"

namespace melforge_test_reliability_resources {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
/// What melforge-build holds besides the audio and output buffers --max-ram bounds: the binary and its shared
/// libraries (the CUDA runtime and cuFFT are mapped even for the CPU engine), HDF5, FFTW and deflate state, thread
/// stacks. `melforge-build --help` alone peaks at about 21 MiB and a tiny build at about 45 MiB.
constexpr int64_t kFixedOverhead = 48 * kMiB;

/// Writes `seconds` of a `hz` tone, 16-bit PCM WAV of `channels` channels (all alike) at `rate`, a second at a time.
void write_wav_seconds(const fs::path& path, int rate, int channels, int seconds, double hz) {
  fs::create_directories(path.parent_path());
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  REQUIRE(f != nullptr);
  std::vector<short> second(static_cast<std::size_t>(rate) * static_cast<std::size_t>(channels));
  for (int i = 0; i < rate; ++i)
    for (int c = 0; c < channels; ++c)
      second[static_cast<std::size_t>(i) * static_cast<std::size_t>(channels) + static_cast<std::size_t>(c)] =
          static_cast<short>(10000 * std::sin(2 * M_PI * hz * i / rate));
  for (int s = 0; s < seconds; ++s) REQUIRE(sf_writef_short(f, second.data(), rate) == rate);
  REQUIRE(sf_close(f) == 0);
}

/// The larger of the child's sampled peak RSS and the one its report gives, bytes.
int64_t build_peak(const test::ChildResult& r, const nlohmann::json& report) {
  return std::max(r.peak_rss_bytes, report.at("peak_rss_bytes").get<int64_t>());
}

}  // namespace

TEST_CASE("the builder stays within --max-ram on a corpus larger than it, with a file larger than it cut by "
          "--max-seconds", "[reliability][resources]") {
  TempDir d;
  const fs::path in = d / "in";
  const int64_t long_frames = 16'000'000;
  test::write_tone(in / "a" / "long.wav", 440, long_frames, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT);
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 12; ++i)
      test::write_tone(in / ("c" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"), 300 + 200 * c + i,
                       20 * 8000, 8000);
  const int64_t max_ram = 32 * kMiB;
  const int64_t corpus_float_bytes = (long_frames + 24 * 20 * 8000) * 4;
  REQUIRE(fs::file_size(in / "a" / "long.wav") > static_cast<uintmax_t>(max_ram));
  REQUIRE(corpus_float_bytes > 2 * max_ram);

  const bool cap = GENERATE(true, false);
  CAPTURE(cap);
  const fs::path out = d / "out";
  std::vector<std::string> extra = {"--max-ram", "32M"};
  if (cap) extra.insert(extra.end(), {"--max-seconds", "60"});
  const auto r = test::run_child(test::build_args(in, out, extra), d / "build.log");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto report = nlohmann::json::parse(test::read_file_bytes(out / "build_report.json"));
  const int64_t self_reported = report.at("peak_rss_bytes").get<int64_t>();
  const int64_t peak = std::max(r.peak_rss_bytes, self_reported);
  INFO("peak RSS sampled " << r.peak_rss_bytes / kMiB << " MiB, reported by the build " << self_reported / kMiB
                           << " MiB; bound " << (max_ram + kFixedOverhead) / kMiB << " MiB");
  CHECK(r.peak_rss_bytes > 0);
  CHECK(report["files"]["written"].get<int>() == 25);
  CHECK(report["clips"]["capped"].get<int>() == (cap ? 1 : 0));
  CHECK(report["batches"].get<int>() > 1);
  CHECK(report["clips"]["seconds_in"].get<double>() == Approx(2000.0 + 24 * 20.0));
  CHECK(report["audio_seconds"].get<double>() == Approx((cap ? 60.0 : 2000.0) + 24 * 20.0));
  if (cap) {
    CHECK(peak <= max_ram + kFixedOverhead);
    CHECK_THAT(r.output, Catch::Contains("warning: --max-seconds 60: 1 clip was cut, 1940.0 s of 2480.0 s") &&
                             !Catch::Contains("more memory than --max-ram"));
  } else {
    CHECK_THAT(r.output, Catch::Contains("warning: 1 clip needs more memory than --max-ram 32M") &&
                             Catch::Contains("'a/long.wav' (2000.0 s)"));
  }
  bool found = false;
  for (const std::string split : {"train", "val", "test"}) {
    const test::SplitData s = test::read_split(out / (split + ".h5"));
    for (std::size_t i = 0; i < s.files(); ++i) {
      if (s.path[i] != "a/long.wav") continue;
      found = true;
      CHECK(s.clips.num_samples[i] == (cap ? 60 * 8000 : long_frames));
      CHECK(s.clips.clip_flags[i] == (cap ? builder::kStoredCapped : 0));
    }
  }
  CHECK(found);
}

TEST_CASE("thread counts follow --threads", "[reliability][resources]") {
  TempDir d;
  test::write_slow_corpus(d / "in", 3, 40);
  std::map<int, test::ChildResult> runs;
  for (const int threads : {1, 2, 4}) {
    const auto r = test::run_child(test::build_args(d / "in", d / ("out" + std::to_string(threads)),
                                                    {"--threads", std::to_string(threads)}),
                                   d / "build.log");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CAPTURE(threads, r.max_threads, r.cpu_s, r.wall_s);
    // --threads 1: main and the signal-waiting thread; main also compresses and writes, so one core is used.
    // More: main + the signal-waiting thread + the HDF5 writer thread, and an OpenMP team of `threads` - 1 helpers
    // for each of the two threads that run parallel loops (main: decode and mel; writer: compression).
    if (threads == 1) {
      CHECK(r.max_threads == 2);
      CHECK(r.cpu_s <= 1.05 * r.wall_s + 0.02);
    } else {
      CHECK(r.max_threads <= 3 + 2 * (threads - 1));
      CHECK(r.max_threads >= 3);
    }
    runs[threads] = r;
  }
  CHECK(runs[4].max_threads > runs[1].max_threads);
}

TEST_CASE("hour-long clips stay within --max-ram: stored whole when they fit, cut by --max-seconds when asked",
          "[reliability][resources]") {
  TempDir d;
  const fs::path in = d / "in";
  for (int i = 0; i < 3; ++i)
    write_wav_seconds(in / ("c" + std::to_string(i % 2)) / ("hour" + std::to_string(i) + ".wav"), 8000, 1, 3600,
                      300.0 + 100 * i);
  const std::string limit = GENERATE("96M", "256M");
  const bool cap = limit == "96M";
  const int64_t max_ram = std::stoll(limit) * kMiB;
  const fs::path out = d / ("out" + limit);
  std::vector<std::string> extra = {"--max-ram", limit};
  if (cap) extra.insert(extra.end(), {"--max-seconds", "600"});
  const auto r = test::run_child(test::build_args(in, out, extra), d / "build.log");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto report = nlohmann::json::parse(test::read_file_bytes(out / "build_report.json"));
  const int64_t peak = build_peak(r, report);
  INFO("--max-ram " << limit << ": peak RSS " << peak / kMiB << " MiB (bound " << (max_ram + kFixedOverhead) / kMiB
                    << " MiB)");
  CHECK(peak <= max_ram + kFixedOverhead);
  CHECK(report["files"]["written"].get<int>() == 3);
  CHECK_THAT(r.output, !Catch::Contains("more memory than --max-ram"));
  const auto& clips = report["clips"];
  CHECK(clips["seconds_in"].get<double>() == Approx(3 * 3600.0));
  if (cap) {
    CHECK(clips["capped"].get<int>() == 3);
    CHECK(clips["seconds_stored"].get<double>() == Approx(3 * 600.0));
    CHECK(clips["seconds_dropped"].get<double>() == Approx(3 * 3000.0));
    CHECK_THAT(r.output, Catch::Contains("warning: --max-seconds 600: 3 clips were cut, 9000.0 s of 10800.0 s"));
  } else {
    CHECK(clips["capped"].get<int>() == 0);
    CHECK(clips["stored_fraction"].get<double>() == Approx(1.0));
    CHECK_THAT(r.output, !Catch::Contains("warning: --max-seconds"));
  }
}

TEST_CASE("files whose header claims 1,024 channels decode within --max-ram", "[reliability][resources]") {
  TempDir d;
  const fs::path in = d / "in";
  for (int i = 0; i < 6; ++i)
    write_wav_seconds(in / ("c" + std::to_string(i % 2)) / ("wide" + std::to_string(i) + ".wav"), 1000, 1024, 3,
                      100.0 + 20 * i);
  const int64_t max_ram = 64 * kMiB;
  const fs::path out = d / "out";
  const auto r = test::run_child(test::build_args(in, out, {"--max-ram", "64M"}), d / "build.log");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto report = nlohmann::json::parse(test::read_file_bytes(out / "build_report.json"));
  const int64_t peak = build_peak(r, report);
  INFO("peak RSS " << peak / kMiB << " MiB, bound " << (max_ram + kFixedOverhead) / kMiB << " MiB");
  CHECK(peak <= max_ram + kFixedOverhead);
  CHECK(report["files"]["written"].get<int>() == 6);
  CHECK(report["files"]["resampled"].get<int>() == 6);
}

TEST_CASE("a build with --threads 10000 is capped at 4 threads per core, with a warning", "[reliability][resources]") {
  TempDir d;
  test::write_slow_corpus(d / "in", 2, 40);
  const int cap = 4 * std::max(1, omp_get_num_procs());
  const auto r = test::run_child(test::build_args(d / "in", d / "out", {"--threads", "10000"}), d / "build.log");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CAPTURE(cap, r.max_threads, r.peak_rss_bytes / kMiB);
  CHECK(r.max_threads <= 3 + 2 * (cap - 1));
  CHECK(r.peak_rss_bytes <= 70 * kMiB + kFixedOverhead);
  CHECK_THAT(r.output, Catch::Contains("melforge-build: warning: --threads 10000 is more than 4 threads per core") &&
                           Catch::Contains("using " + std::to_string(cap) + "\n"));
}

}  // namespace melforge_test_reliability_resources
