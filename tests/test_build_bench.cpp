// melforge-build bench: every stage timed on a small generated corpus, its counts and compressed bytes against a
// normal build of the same corpus, bad parameters, skipped files, the scratch folder, and the binary.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <hdf5.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench.h"
#include "build_fixture.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_build_bench {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kStages = {"scan", "probe", "engine_init", "decode", "mel",
                                          "compress", "write", "write_raw", "end_to_end"};

/// Entries of `dir` (0 when it is missing).
int entries(const fs::path& dir) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n;
}

/// Bytes of `frames` chunks stored in the three split files of a build in `out` (H5Dget_storage_size).
int64_t stored_mel_bytes(const fs::path& out) {
  int64_t total = 0;
  for (const std::string split : {"train", "val", "test"}) {
    auto f = h5::open_file(out / (split + ".h5"));
    auto ds = h5::open_dataset(f, "frames");
    total += static_cast<int64_t>(H5Dget_storage_size(ds.id()));
  }
  return total;
}

builder::BenchOptions bench_options(const TempDir& d, int repeats) {
  builder::BenchOptions o;
  o.repeats = repeats;
  fs::create_directories(d / "scratch");
  o.scratch = d / "scratch";
  o.bench_out = d / "bench.json";
  return o;
}

int run_cli(const std::string& args, const fs::path& log) {
  const std::string cmd = std::string(MELFORGE_BUILD_EXE) + " " + args + " >" + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("bench times every stage and counts what a normal build of the corpus writes", "[bench]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 4);
  const auto c = test::tone_build_config(d / "in", {});
  const auto opts = bench_options(d, 2);
  std::ostringstream table;
  std::ostringstream log;
  const nlohmann::json b = builder::run_bench(c, opts, table, log);
  const auto r = builder::run_build(test::tone_build_config(d / "in", d / "out")).report;

  for (const auto& s : kStages) {
    CAPTURE(s);
    REQUIRE(b["stages"].contains(s));
    const auto secs = b["stages"][s]["seconds"].get<std::vector<double>>();
    REQUIRE(secs.size() == 2);
    for (double t : secs) CHECK(t > 0);
    const double lo = std::min(secs[0], secs[1]);
    const double hi = std::max(secs[0], secs[1]);
    CHECK(b["stages"][s]["median_s"].get<double>() == Approx(0.5 * (lo + hi)));
    CHECK_THAT(table.str(), Catch::Contains("\n" + s + " "));
  }
  CHECK(b["files"]["written"].get<int64_t>() == r["files"]["written"].get<int64_t>());
  CHECK(b["files"]["scanned"].get<int64_t>() == r["files"]["scanned"].get<int64_t>());
  CHECK(b["files"]["skipped"].get<int64_t>() == r["files"]["skipped"].get<int64_t>());
  CHECK(b["frames"].get<int64_t>() == r["clips"]["frames"].get<int64_t>());
  CHECK(b["audio_seconds"].get<double>() == Approx(r["audio_seconds"].get<double>()));
  CHECK(b["files"]["selected"].get<int64_t>() == 15);
  CHECK(b["bench"]["whole_corpus"].get<bool>());

  const double frames = static_cast<double>(r["clips"]["frames"].get<int64_t>());
  CHECK(b["stages"]["mel"]["per_s"]["frames"].get<double>() ==
        Approx(frames / b["stages"]["mel"]["median_s"].get<double>()));
  const double e2e_files = static_cast<double>(r["files"]["written"].get<int64_t>());
  CHECK(b["stages"]["end_to_end"]["per_s"]["files"].get<double>() ==
        Approx(e2e_files / b["stages"]["end_to_end"]["median_s"].get<double>()));

  // The writer's chunks: as many frames as fit in 1 MiB, every split's last chunk zero-padded to a whole chunk.
  const int64_t frame_bytes = 32 * 2;
  const int64_t fpc = (int64_t{1} << 20) / frame_bytes;
  int64_t chunks = 0;
  for (const std::string split : {"train", "val", "test"}) {
    const int64_t n = test::read_split(d / "out" / (split + ".h5")).dims[0];
    chunks += (n + fpc - 1) / fpc;
  }
  CHECK(b["chunks"]["frames_per_chunk"].get<int64_t>() == fpc);
  CHECK(b["chunks"]["count"].get<int64_t>() == chunks);
  CHECK(b["bytes"]["frames"].get<int64_t>() == chunks * fpc * frame_bytes);
  CHECK(b["bytes"]["compressed"].get<int64_t>() == stored_mel_bytes(d / "out"));
  CHECK(b["bytes"]["written"].get<int64_t>() == b["bytes"]["compressed"].get<int64_t>());
  CHECK(b["bytes"]["written_raw"].get<int64_t>() == b["bytes"]["frames"].get<int64_t>());
  CHECK(b["stages"]["compress"]["ratio"].get<double>() > 1.0);
  CHECK(b["checks"]["written_equal_build"].get<bool>());
  CHECK(b["checks"]["frames_equal_build"].get<bool>());
  CHECK(b["checks"]["compressed_bytes_equal_build"].get<bool>());

  double sum = 0;
  for (const auto& s : b["sum_includes"]) sum += b["stages"][s.get<std::string>()]["median_s"].get<double>();
  CHECK(b["sum_of_stages_s"].get<double>() == Approx(sum));
  CHECK(b["overlap"].get<double>() == Approx(sum / b["stages"]["end_to_end"]["median_s"].get<double>()));

  std::ifstream jf(opts.bench_out);
  const auto j = nlohmann::json::parse(jf);
  CHECK(j == b);
  CHECK(entries(d / "scratch") == 0);
}

TEST_CASE("bench's compressed bytes equal a build's stored chunks for any dtype, level and chunk size", "[bench]") {
  struct Case {
    mel::DType dtype;
    int level;
    bool shuffle;
    int64_t frames_per_chunk;
  };
  const Case k = GENERATE(Case{mel::DType::float16, 4, true, 0}, Case{mel::DType::float32, 1, true, 96},
                          Case{mel::DType::float16, 9, false, 200}, Case{mel::DType::float32, 0, true, 400});
  CAPTURE(mel::to_string(k.dtype), k.level, k.shuffle, k.frames_per_chunk);
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 5);
  auto c = test::tone_build_config(d / "in", d / "out");
  c.build.dtype = k.dtype;
  c.build.compression_level = k.level;
  c.build.shuffle = k.shuffle;
  c.build.frames_per_chunk = k.frames_per_chunk;
  c.build.threads = 2;
  const auto r = builder::run_build(c).report;
  c.build.output.clear();
  std::ostringstream sink;
  const auto b = builder::run_bench(c, bench_options(d, 1), sink, sink);

  CHECK(b["bytes"]["compressed"].get<int64_t>() == stored_mel_bytes(d / "out"));
  CHECK(b["frames"].get<int64_t>() == r["clips"]["frames"].get<int64_t>());
  CHECK(b["stages"].contains("compress") == (k.level > 0));
  CHECK(b["stages"].contains("write_raw") == (k.level > 0));
  if (k.level > 0) CHECK(b["stages"]["compress"]["ratio"].get<double>() > 1.0);
  if (k.level == 0) CHECK(b["bytes"]["compressed"].get<int64_t>() == b["bytes"]["frames"].get<int64_t>());
  CHECK(entries(d / "scratch") == 0);
}

TEST_CASE("bench samples --bench-files files evenly and builds the same sample end to end", "[bench]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 6);
  const int n = GENERATE(1, 5, 11);
  CAPTURE(n);
  auto opts = bench_options(d, 1);
  opts.bench_files = n;
  std::ostringstream sink;
  const auto b = builder::run_bench(test::tone_build_config(d / "in", {}), opts, sink, sink);
  CHECK(b["files"]["audio_files"].get<int64_t>() == 21);
  CHECK(b["files"]["selected"].get<int64_t>() == n);
  CHECK(b["files"]["written"].get<int64_t>() == n);
  CHECK_FALSE(b["bench"]["whole_corpus"].get<bool>());
  CHECK(b["checks"]["written_equal_build"].get<bool>());
  CHECK(b["checks"]["frames_equal_build"].get<bool>());
  CHECK(b["checks"]["compressed_bytes_equal_build"].get<bool>());
  CHECK(entries(d / "scratch") == 0);
}

TEST_CASE("bench refuses bad parameters before any work", "[bench]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  auto c = test::tone_build_config(d / "in", {});
  auto opts = bench_options(d, 1);
  const int which = GENERATE(range(0, 7));
  CAPTURE(which);
  switch (which) {
    case 0: opts.repeats = 0; break;
    case 1: opts.bench_files = -1; break;
    case 2: opts.scratch = d / "no-such-folder"; break;
    case 3: opts.bench_out = d / "no-such-folder/bench.json"; break;
    case 4: c.clips.short_seconds = 0; break;
    case 5: c.build.compression_level = 12; break;
    default: c.build.input = d / "missing"; break;
  }
  std::ostringstream sink;
  CHECK_THROWS_AS(builder::run_bench(c, opts, sink, sink), InvalidArgument);
  CHECK(entries(d / "scratch") == 0);
  CHECK_FALSE(fs::exists(d / "bench.json"));
  CHECK(sink.str().empty());
}

TEST_CASE("bench lists bad files as skipped, like a build, and --strict stops at the first", "[bench]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  test::write_text(d / "in/class0/text.wav", "this is not audio at all, just text pretending to be a wav file\n");
  test::write_tone(d / "in/class1/nan.wav", 440, 9000, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 4000);
  test::write_text(d / "in/class1/notes.txt", "notes");
  auto c = test::tone_build_config(d / "in", {});
  std::ostringstream table;
  const auto b = builder::run_bench(c, bench_options(d, 2), table, table);
  const auto r = builder::run_build(test::tone_build_config(d / "in", d / "out")).report;

  std::map<std::string, std::string> got;
  for (const auto& s : b["skipped"]) got[s["path"].get<std::string>()] = s["stage"].get<std::string>();
  std::map<std::string, std::string> want;
  for (const auto& s : r["skipped"]) want[s["path"].get<std::string>()] = s["stage"].get<std::string>();
  CHECK(got == std::map<std::string, std::string>{
                   {"class0/text.wav", "probe"}, {"class1/nan.wav", "decode"}, {"class1/notes.txt", "scan"}});
  CHECK(got == want);
  CHECK(b["files"]["skipped"].get<int64_t>() == 3);
  CHECK(b["files"]["written"].get<int64_t>() == r["files"]["written"].get<int64_t>());
  CHECK(b["frames"].get<int64_t>() == r["clips"]["frames"].get<int64_t>());
  CHECK(b["bytes"]["compressed"].get<int64_t>() == stored_mel_bytes(d / "out"));
  CHECK_THAT(table.str(), Catch::Contains("skipped class1/nan.wav"));
  CHECK_THAT(table.str(), Catch::Contains("skipped class0/text.wav"));

  c.build.strict = true;
  CHECK_THROWS_AS(builder::run_bench(c, bench_options(d, 1), table, table), StrictError);
  CHECK(entries(d / "scratch") == 0);
}

TEST_CASE("melforge-build bench: the binary's flags, JSON, exit codes and SIGINT", "[bench][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  fs::create_directories(d / "scratch");
  const std::string io = "bench --input " + (d / "in").string() + " --sample-rate 8000 --n-fft 256 --hop-length 64 " +
                         "--n-mels 32 --short-seconds 0.25 --device cpu --scratch " +
                         (d / "scratch").string();
  const fs::path log = d / "log.txt";
  CHECK(run_cli("bench --help", log) == 0);
  CHECK_THAT(read_text(log), Catch::Contains("--bench-files"));
  CHECK_THAT(read_text(log), Catch::Contains("--n-fft"));
  CHECK(run_cli("--help", log) == 0);
  CHECK_THAT(read_text(log), Catch::Contains("bench --help"));
  CHECK_THAT(read_text(log), !Catch::Contains("--bench-files"));

  CHECK(run_cli(io + " --repeats 2 --output " + (d / "unused").string() + " --bench-out " +
                    (d / "b.json").string(), log) == 0);
  const std::string text = read_text(log);
  for (const auto& s : kStages) CHECK_THAT(text, Catch::Contains("\n" + s + " "));
  std::ifstream jf(d / "b.json");
  const auto j = nlohmann::json::parse(jf);
  for (const auto& s : kStages) CHECK(j["stages"][s]["seconds"].size() == 2);
  CHECK(j["files"]["written"].get<int>() == 8);
  CHECK(j["config"]["hop_length"].get<int>() == 64);
  CHECK_FALSE(fs::exists(d / "unused"));
  CHECK(entries(d / "scratch") == 0);

  CHECK(run_cli(io + " --repeats 0", log) == 2);
  CHECK(run_cli(io + " --bench-files -1", log) == 2);
  CHECK(run_cli(io + " --hop-length 0", log) == 2);
  CHECK(run_cli(io + " --no-such-flag 1", log) == 2);
  CHECK(entries(d / "scratch") == 0);

  // Many repeats of a tiny corpus keep the bench busy for far longer than the signal's delay.
  const std::string cmd = "timeout --foreground --preserve-status -s INT 1.5 " + std::string(MELFORGE_BUILD_EXE) + " " + io +
                          " --repeats 1000000 --quiet >" + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 130);
  CHECK_THAT(read_text(log), Catch::Contains("interrupted by SIGINT"));
  CHECK(entries(d / "scratch") == 0);
}

}  // namespace melforge_test_build_bench
