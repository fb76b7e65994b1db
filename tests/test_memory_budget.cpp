// The --max-ram cap of num_long (issue 15): one file of the automatic num_long must fit what --max-ram leaves after
// the per-thread and engine buffers; an explicit --num-long is kept. The child-process peaks are measured in
// test_reliability_resources.cpp.
#include <catch2/catch.hpp>

#include <limits>

#include "batch_runner.h"
#include "build_fixture.h"
#include "build_state.h"

namespace melforge_test_memory_budget {

using namespace melforge;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

/// A build state with one hour-long 8 kHz mono file planned with num_long 3600 (`given`: --num-long 3600, else
/// auto), under --max-ram `max_ram` on 2 threads.
struct HourLongBuild {
  explicit HourLongBuild(const std::string& max_ram, bool given)
      : config(make_config(max_ram, given)), state(config) {
    input.path = "hour.wav";
    input.rel_path = "c/hour.wav";
    input.label = "c";
    builder::PlannedFile f;
    f.input = &input;
    f.info.sample_rate = 8000;
    f.info.channels = 1;
    f.info.frames = 3600 * 8000;
    f.info.format = "WAV PCM_16";
    f.frames = f.info.frames;
    state.num_long = 3600;
    state.num_short = config.segment.num_short(8000);
    f.plan = segment::plan_file(f.frames, config.segment, 8000, state.num_long);
    state.usable.push_back(f);
  }

  static builder::BuildConfig make_config(const std::string& max_ram, bool given) {
    builder::BuildConfig c = test::tone_build_config("in", "out");
    c.build.max_ram = max_ram;
    c.build.threads = 2;
    if (given) c.segment.num_long = 3600;
    return c;
  }

  builder::InputFile input;
  builder::BuildConfig config;
  builder::BuildState state;
};

}  // namespace

TEST_CASE("num_long_cap is the most long segments that fit the budget, at least 1", "[stages][resources]") {
  CHECK(builder::num_long_cap(100 * kMiB, kMiB) == 100);
  CHECK(builder::num_long_cap(100 * kMiB + kMiB - 1, kMiB) == 100);
  CHECK(builder::num_long_cap(kMiB - 1, kMiB) == 1);
  CHECK(builder::num_long_cap(-5 * kMiB, kMiB) == 1);
  CHECK(builder::num_long_cap(int64_t{1} << 62, 1) == std::numeric_limits<int>::max());
}

TEST_CASE("the automatic num_long is capped so that one file fits --max-ram, and a given --num-long is kept",
          "[stages][resources]") {
  const std::string max_ram = GENERATE("64M", "96M", "256M");
  CAPTURE(max_ram);
  HourLongBuild auto_build(max_ram, false);
  builder::init_engine(auto_build.state);
  const builder::BuildState& s = auto_build.state;
  const int64_t per_long = builder::long_segment_bytes(s);
  const int64_t held = builder::batch_reserve(s.threads, builder::largest_worker_bytes(s.audio_stages, s.usable),
                                              s.engine->host_bytes()) -
                       builder::kFixedReserveBytes;
  const int64_t room = auto_build.config.build.max_ram_bytes() - held;
  CAPTURE(per_long, held, room, s.num_long);
  CHECK(per_long == 8000 * 4 + 4 * 4 * (32 * 32 * 2));
  CHECK(held <= 2 * 2 * kMiB + s.engine->host_bytes());
  if (3600 * per_long <= room) {
    CHECK(s.num_long == 3600);
  } else {
    CHECK(s.num_long >= 1);
    CHECK((s.num_long == 1 || s.num_long * per_long <= room));
    CHECK((s.num_long + 1) * per_long > room);
  }
  CHECK(s.usable[0].plan.num_valid_long == s.num_long);
  CHECK(s.usable[0].plan.arena_samples == int64_t{s.num_long} * 8000);
  CHECK(s.usable[0].plan.capped == (s.num_long < 3600));

  HourLongBuild given(max_ram, true);
  builder::init_engine(given.state);
  CHECK(given.state.num_long == 3600);
  CHECK(given.state.usable[0].plan.num_valid_long == 3600);
}

}  // namespace melforge_test_memory_budget
