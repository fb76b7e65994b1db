#include <catch2/catch.hpp>

#include "melforge/common/errors.h"
#include "segment/segment_args.h"

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
  const int sr = GENERATE(8000, 16000, 22050, 44100);
  const auto a = args_of(2.0, 0.25);
  CHECK(a.long_samples(sr) == 2 * sr);
  CHECK(a.short_samples(sr) == static_cast<int64_t>(std::llround(0.25 * sr)));
  CHECK(a.num_short(sr) == a.long_samples(sr) / a.short_samples(sr));
}

TEST_CASE("a long segment that is not a multiple of the short one leaves a remainder unused", "[segment]") {
  const auto a = args_of(1.0, 0.3);
  CHECK(a.num_short(10000) == 3);
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
    CHECK(p.num_valid_long == std::min(7, num_long));
    CHECK(p.capped == (7 > num_long));
    CHECK(p.arena_samples == p.num_valid_long * 1000);
    CHECK(p.dropped_samples == frames - p.arena_samples);
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
