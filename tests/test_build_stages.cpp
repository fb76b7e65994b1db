// The per-file audio stages of the batch runner: a stage inserted after decode runs on every decoded file in a build
// and in the bench, changes what mel sees, is listed in the timings, skips the files it rejects, and its declared
// needs reach the --max-ram batch planning.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "batch_runner.h"
#include "bench.h"
#include "build_fixture.h"
#include "build_state.h"
#include "mel/mel_cpu.h"
#include "melforge/common/errors.h"
#include "pipeline.h"
#include "test_util.h"

namespace melforge_test_build_stages {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A stage named "gain" that multiplies the samples by `gain`, counts its calls, declares the given needs, and
/// rejects (AudioError) the files whose path contains `reject`.
class GainStage : public builder::AudioStage {
 public:
  explicit GainStage(float gain, int64_t batch_bytes = 0, int64_t worker_bytes = 0, std::string reject = "")
      : gain_(gain), batch_bytes_(batch_bytes), worker_bytes_(worker_bytes), reject_(std::move(reject)) {}
  std::string name() const override { return "gain"; }
  int64_t batch_bytes(const builder::PlannedCopy&) const override { return batch_bytes_; }
  int64_t worker_bytes(const builder::PlannedCopy&) const override { return worker_bytes_; }
  void run(builder::BatchFile& file) const override {
    calls++;
    const std::string& path = file.file->input->rel_path;
    if (!reject_.empty() && path.find(reject_) != std::string::npos) throw AudioError(path + ": rejected by gain");
    for (float& s : file.samples) s *= gain_;
  }
  /// Calls of run(), from every thread.
  mutable std::atomic<int64_t> calls{0};

 private:
  float gain_;
  int64_t batch_bytes_;
  int64_t worker_bytes_;
  std::string reject_;
};

builder::BenchOptions bench_options(const TempDir& d, int repeats) {
  builder::BenchOptions o;
  o.repeats = repeats;
  fs::create_directories(d / "scratch");
  o.scratch = d / "scratch";
  return o;
}

}  // namespace

TEST_CASE("make_audio_stages puts decode first and the extra stages after it, in order", "[stages]") {
  const auto gain = std::make_shared<GainStage>(1.0f);
  const builder::AudioStages stages = builder::make_audio_stages(builder::BuildConfig{}, {gain, gain});
  REQUIRE(stages.size() == 3);
  CHECK(stages[0]->name() == "decode");
  CHECK(stages[1] == gain);
  CHECK(stages[2] == gain);
}

TEST_CASE("an extra audio stage runs on every decoded file of a build and of the bench", "[stages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  test::write_tone(d / "in/class1/nan.wav", 440, 9000, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 4000);
  const auto gain = std::make_shared<GainStage>(1.0f);
  const auto r = builder::run_build(test::tone_build_config(d / "in", d / "gain"), {gain}).report;
  builder::run_build(test::tone_build_config(d / "in", d / "plain"));

  const auto written = r["files"]["written"].get<int64_t>();
  CHECK(written == 10);
  CHECK(gain->calls == written);
  CHECK(r["times_s"].contains("gain"));
  for (const std::string split : {"train", "val", "test"})
    CHECK(read_split(d / "gain" / (split + ".h5")).frames == read_split(d / "plain" / (split + ".h5")).frames);

  gain->calls = 0;
  std::ostringstream table;
  const auto b = builder::run_bench(test::tone_build_config(d / "in", {}), bench_options(d, 2), table, table, {gain});
  CHECK(gain->calls == 2 * written + 2 * written);
  CHECK(b["files"]["written"].get<int64_t>() == written);
  REQUIRE(b["stages"].contains("gain"));
  CHECK(b["stages"]["gain"]["seconds"].size() == 2);
  CHECK(b["sum_includes"].dump().find("\"gain\"") != std::string::npos);
  CHECK_THAT(table.str(), Catch::Contains("\ngain "));
  CHECK(b["checks"]["compressed_bytes_equal_build"].get<bool>());
}

TEST_CASE("an extra audio stage sits between decode and mel", "[stages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  builder::run_build(test::tone_build_config(d / "in", d / "plain"));
  builder::run_build(test::tone_build_config(d / "in", d / "half"), {std::make_shared<GainStage>(0.5f)});
  const auto plain = read_split(d / "plain/train.h5");
  const auto half = read_split(d / "half/train.h5");
  REQUIRE(plain.frames.size() == half.frames.size());
  CHECK(plain.frames != half.frames);
}

TEST_CASE("a file an audio stage rejects is skipped at that stage, or stops a --strict build and bench", "[stages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const auto reject = std::make_shared<GainStage>(1.0f, 0, 0, "class1/f2");
  auto c = test::tone_build_config(d / "in", d / "out");
  const auto r = builder::run_build(c, {reject}).report;
  REQUIRE(r["skipped"].size() == 1);
  CHECK(r["skipped"][0]["path"] == "class1/f2.wav");
  CHECK(r["skipped"][0]["stage"] == "gain");
  CHECK(r["files"]["written"].get<int64_t>() == 7);

  std::ostringstream sink;
  c.build.output.clear();
  const auto b = builder::run_bench(c, bench_options(d, 1), sink, sink, {reject});
  CHECK(b["skipped"] == r["skipped"]);

  c.build.strict = true;
  c.build.output = d / "strict";
  CHECK_THROWS_AS(builder::run_build(c, {reject}), StrictError);
  c.build.output.clear();
  CHECK_THROWS_AS(builder::run_bench(c, bench_options(d, 1), sink, sink, {reject}), StrictError);
}

TEST_CASE("the --max-ram batch planning adds up the needs every audio stage declares", "[stages]") {
  builder::PlannedFile file;
  file.info.sample_rate = 8000;
  file.info.channels = 1;
  file.info.frames = 16000;
  file.frames = 16000;
  builder::BuildConfig config;
  config.mel.sample_rate = 8000;
  file.plan = builder::plan_clip(16000, 0, config.mel);
  builder::BuildState state(config, {std::make_shared<GainStage>(1.0f, 1000, 1 << 30)});
  state.usable = {file};
  const builder::PlannedCopy row{&state.usable[0], {}, file.plan};
  CHECK(builder::batch_row_bytes(state.audio_stages, row, 500) == 4 * 16000 + 1000 + 2 * 500 * file.plan.frames);
  CHECK(builder::largest_worker_bytes(state.audio_stages, state) == int64_t{1} << 30);

  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  auto c = test::tone_build_config(d / "in", d / "plain");
  c.build.max_ram = "2G";
  c.build.threads = 2;
  const auto plain = builder::run_build(c).report;
  CHECK(plain["batches"].get<int>() == 3);
  const int64_t files = plain["files"]["written"].get<int64_t>();

  c.build.output = d / "batch_bytes";
  const auto big_batch = std::make_shared<GainStage>(1.0f, builder::kPipelineBatchBytes / 2);
  CHECK(builder::run_build(c, {big_batch}).report["batches"].get<int64_t>() == files);

  c.build.output = d / "worker_bytes";
  const auto big_worker = std::make_shared<GainStage>(1.0f, 0, int64_t{1} << 30);
  CHECK(builder::run_build(c, {big_worker}).report["batches"].get<int64_t>() == files);
}

TEST_CASE("the --max-ram batch budget reserves 64 MiB, each worker's needs and the engine's host memory", "[stages]") {
  constexpr int64_t MiB = int64_t{1} << 20;
  CHECK(builder::batch_budget(200 * MiB, 2, 10 * MiB, 100 * MiB) == (200 - 64 - 20 - 100) * MiB);
  CHECK(builder::batch_budget(110 * MiB, 2, 10 * MiB, 0) == (110 - 64 - 20) * MiB);
  CHECK(builder::batch_budget(100 * MiB, 1, 0, 100 * MiB) == 1);
  CHECK(builder::batch_budget(int64_t{1} << 50, 1, 0, 0) == builder::kPipelineBatchBytes);

  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  auto c = test::tone_build_config(d / "in", d / "out");
  c.build.threads = 1;
  c.build.device = mel::Device::cpu;
  builder::BuildState state(c);
  builder::init_engine(state);
  CHECK(state.engine->host_bytes() > 0);
  CHECK(state.engine->host_bytes() == mel::cpu_engine_host_bytes([&] {
    mel::EngineConfig e;
    e.mel = c.mel;
    e.segment_samples = c.clips.short_samples(state.sample_rate);
    e.dtype = c.build.dtype;
    e.threads = 1;
    return e;
  }()));
}

}  // namespace melforge_test_build_stages
