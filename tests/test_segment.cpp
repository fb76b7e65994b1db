#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "melforge/common/errors.h"
#include "segment/segment_args.h"

namespace melforge_test_segment {

using namespace melforge::segment;

namespace {

SegmentArgs args_of(double long_s, double short_s, ShortFilePolicy p = ShortFilePolicy::pad) {
  SegmentArgs a;
  a.long_seconds = long_s;
  a.short_seconds = short_s;
  a.short_files = p;
  return a;
}

}  // namespace

TEST_CASE("segment lengths in samples", "[segment]") {
  // Lengths in whole milliseconds, so that the expected sample counts come from integer arithmetic: round(ms*sr/1000)
  // half away from zero is (2*ms*sr + 1000) / 2000. The short lengths include binary fractions of a second whose
  // sample counts end in .5 at 22050 Hz (250 ms: 5512.5, 125 ms: 2756.25, 750 ms: 16537.5).
  struct Lengths {
    int64_t long_ms, short_ms;
  };
  const int sr = GENERATE(8000, 16000, 22050, 44100);
  const Lengths l = GENERATE(Lengths{2000, 250}, Lengths{1000, 300}, Lengths{1000, 125}, Lengths{3000, 750},
                             Lengths{1000, 1000}, Lengths{1500, 400}, Lengths{10, 3});
  CAPTURE(sr, l.long_ms, l.short_ms);
  const auto a = args_of(static_cast<double>(l.long_ms) / 1000.0, static_cast<double>(l.short_ms) / 1000.0);
  const int64_t long_samples = (2 * l.long_ms * sr + 1000) / 2000;
  const int64_t short_samples = (2 * l.short_ms * sr + 1000) / 2000;
  int num_short = 0;
  for (int64_t end = short_samples; end <= long_samples; end += short_samples) ++num_short;
  CHECK(a.long_samples(sr) == long_samples);
  CHECK(a.short_samples(sr) == short_samples);
  CHECK(a.num_short(sr) == num_short);
}

TEST_CASE("a long segment that is not a multiple of the short one leaves a remainder unused", "[segment]") {
  const auto a = args_of(1.0, 0.3);
  CHECK(a.num_short(10000) == 3);
}

TEST_CASE("plan_file agrees with a naive walk over the file", "[segment]") {
  // At 1000 Hz a long segment is 1000 samples and a short one 250. The naive plan walks the file one long segment
  // at a time and keeps at most num_long of them.
  const int sr = 1000;
  const int64_t L = 1000, S = 250;
  const auto policy = GENERATE(ShortFilePolicy::pad, ShortFilePolicy::skip);
  const int num_long = GENERATE(1, 2, 5);
  const int64_t frames = GENERATE(0, 1, 249, 250, 251, 999, 1000, 1001, 1999, 2000, 2001, 4999, 5000, 5001, 7010,
                                  123457);
  CAPTURE(to_string(policy), num_long, frames);
  int64_t whole = 0;
  for (int64_t start = 0; start + L <= frames; start += L) ++whole;
  const bool too_short = frames < S || (whole == 0 && policy == ShortFilePolicy::skip);
  const int64_t kept = too_short ? 0 : std::max<int64_t>(1, std::min<int64_t>(whole, num_long));

  const auto p = plan_file(frames, args_of(1.0, 0.25, policy), sr, num_long);
  CHECK(p.skip_reason.empty() == !too_short);
  CHECK(p.num_valid_long == kept);
  CHECK(p.arena_samples == kept * L);
  CHECK(p.padded_samples == (!too_short && whole == 0 ? L - frames : 0));
  CHECK(p.dropped_samples == (too_short || whole == 0 ? 0 : frames - kept * L));
  CHECK(p.capped == (whole > num_long));
}

TEST_CASE("plan_file cases", "[segment]") {
  const int sr = 1000;
  const auto a = args_of(1.0, 0.25);
  const int num_long = GENERATE(1, 2, 5);

  SECTION("shorter than one short segment is skipped") {
    const auto p = plan_file(249, a, sr, num_long);
    CHECK(p.num_valid_long == 0);
    CHECK(p.skip_reason.find("too short") != std::string::npos);
  }
  SECTION("exactly one short segment is padded to a long one") {
    const auto p = plan_file(250, a, sr, num_long);
    CHECK(p.skip_reason.empty());
    CHECK(p.num_valid_long == 1);
    CHECK(p.arena_samples == 1000);
    CHECK(p.padded_samples == 750);
  }
  SECTION("short file skipped under the skip policy") {
    const auto p = plan_file(999, args_of(1.0, 0.25, ShortFilePolicy::skip), sr, num_long);
    CHECK(p.num_valid_long == 0);
    CHECK_FALSE(p.skip_reason.empty());
  }
  SECTION("exactly one long segment") {
    const auto p = plan_file(1000, a, sr, num_long);
    CHECK(p.num_valid_long == 1);
    CHECK(p.padded_samples == 0);
    CHECK(p.dropped_samples == 0);
    CHECK_FALSE(p.capped);
  }
  SECTION("the tail past the last whole long segment is dropped and counted") {
    const auto p = plan_file(1999, a, sr, num_long);
    CHECK(p.num_valid_long == 1);
    CHECK(p.dropped_samples == 999);
  }
  SECTION("long files are capped at num_long") {
    const int64_t frames = 7 * 1000 + 10;
    const auto p = plan_file(frames, a, sr, num_long);
    const int kept = std::min(7, num_long);
    CHECK(p.num_valid_long == kept);
    CHECK(p.capped == (7 > num_long));
    CHECK(p.arena_samples == kept * 1000);
    CHECK(p.dropped_samples == frames - kept * 1000);
  }
}

TEST_CASE("auto num_long is the most common whole count, ties to the smaller", "[segment]") {
  const auto a = args_of(1.0, 0.25);
  CHECK(resolve_num_long({100, 2500, 2600, 3100}, a, 1000) == 2);
  CHECK(resolve_num_long({100, 1500, 2500, 2600, 3100}, a, 1000) == 1);
  CHECK(resolve_num_long({100, 200, 2500}, a, 1000) == 1);
  CHECK(resolve_num_long({1000, 2000}, a, 1000) == 1);
  CHECK(resolve_num_long({}, a, 1000) == 1);
  auto fixed = a;
  fixed.num_long = 4;
  CHECK(resolve_num_long({100, 1500}, fixed, 1000) == 4);
}

TEST_CASE("invalid segmentation parameters are rejected", "[segment]") {
  CHECK_THROWS_AS(args_of(0.25, 1.0).validate(16000), melforge::InvalidArgument);
  CHECK_THROWS_AS(args_of(0.0, 0.0).validate(16000), melforge::InvalidArgument);
  CHECK_THROWS_AS(args_of(1.0, -0.1).validate(16000), melforge::InvalidArgument);
  auto a = args_of(1.0, 0.25);
  a.num_long = -1;
  CHECK_THROWS_AS(a.validate(16000), melforge::InvalidArgument);
  CHECK_NOTHROW(args_of(1.0, 1.0).validate(16000));
}

}  // namespace melforge_test_segment
