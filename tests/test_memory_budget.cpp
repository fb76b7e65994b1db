// --max-ram and whole clips (issue 28): a batch holds the rows whose arena slices and frames fit the budget, so memory
// grows with the real audio of a batch, not with the longest clip; a clip that alone needs more than --max-ram leaves
// is a warning naming it and --max-seconds. The child-process peaks are measured in test_reliability_resources.cpp.
#include <catch2/catch.hpp>

#include <algorithm>

#include "batch_runner.h"
#include "build_fixture.h"
#include "build_state.h"
#include "mel/mel_math.h"

namespace melforge_test_memory_budget {

using namespace melforge;

namespace {

/// A build state with one 8 kHz mono file of `seconds` seconds, planned under --max-ram `max_ram` and --max-seconds
/// `max_seconds` on 2 threads.
struct OneFileBuild {
  OneFileBuild(const std::string& max_ram, double seconds, double max_seconds)
      : config(make_config(max_ram, max_seconds)), state(config) {
    input.path = "long.wav";
    input.rel_path = "c/long.wav";
    input.label = "c";
    builder::PlannedFile f;
    f.input = &input;
    f.info.sample_rate = 8000;
    f.info.channels = 1;
    f.info.frames = static_cast<int64_t>(seconds * 8000);
    f.info.format = "WAV PCM_16";
    f.frames = f.info.frames;
    f.plan = builder::plan_clip(f.frames, state.max_samples, config.mel);
    state.usable.push_back(f);
  }

  static builder::BuildConfig make_config(const std::string& max_ram, double max_seconds) {
    builder::BuildConfig c = test::tone_build_config("in", "out");
    c.build.max_ram = max_ram;
    c.build.threads = 2;
    c.clips.max_seconds = max_seconds;
    return c;
  }

  builder::InputFile input;
  builder::BuildConfig config;
  builder::BuildState state;
};

}  // namespace

TEST_CASE("a row's batch bytes are its arena slice and two copies of its frames, whatever the longest clip",
          "[stages][resources]") {
  const double seconds = GENERATE(0.01, 0.3, 30.0);
  CAPTURE(seconds);
  OneFileBuild b("1G", seconds, 0);
  const builder::PlannedFile& f = b.state.usable[0];
  const builder::PlannedCopy row{&f, {}, f.plan};
  const int64_t samples = f.frames;
  const int64_t frames = mel::clip_frames(samples, 256, 64, 128);
  CHECK(f.plan.frames == frames);
  CHECK(b.state.frame_bytes() == 32 * 2);
  CHECK(builder::batch_row_bytes(b.state.audio_stages, row, b.state.frame_bytes()) == 4 * samples + 2 * frames * 64);
}

TEST_CASE("a clip that alone exceeds --max-ram is a warning naming it and --max-seconds, and a cap removes it",
          "[stages][resources]") {
  const std::string max_ram = GENERATE("96M", "1G");
  const double max_seconds = GENERATE(0.0, 60.0);
  CAPTURE(max_ram, max_seconds);
  OneFileBuild hour(max_ram, 3600, max_seconds);
  builder::init_engine(hour.state);
  const builder::BuildState& s = hour.state;
  const builder::PlannedCopy row{&s.usable[0], {}, s.usable[0].plan};
  const int64_t bytes = builder::batch_row_bytes(s.audio_stages, row, s.frame_bytes());
  const int64_t room = hour.config.build.max_ram_bytes() + builder::kFixedReserveBytes -
                       builder::batch_reserve(s.threads, builder::largest_worker_bytes(s.audio_stages, s),
                                              s.held_bytes());
  CAPTURE(bytes, room);
  CHECK(s.usable[0].plan.capped() == (max_seconds > 0));
  CHECK(s.usable[0].plan.samples == (max_seconds > 0 ? 60 * 8000 : 3600 * 8000));
  const bool over = bytes > room;
  CHECK(over == (max_ram == "96M" && max_seconds == 0));
  REQUIRE(s.scan.warnings.size() == (over ? 1u : 0u));
  if (over)
    CHECK_THAT(s.scan.warnings[0], Catch::Contains("1 clip needs more memory than --max-ram " + max_ram) &&
                                       Catch::Contains("c/long.wav") && Catch::Contains("3600.0 s") &&
                                       Catch::Contains("--max-seconds"));
}

}  // namespace melforge_test_memory_budget
