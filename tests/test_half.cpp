// float <-> IEEE half conversions of mel/half.h: exact values, round-to-nearest-even at every boundary, subnormals,
// overflow, infinities, NaN, and agreement with the compiler's _Float16 conversion where it exists.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mel/half.h"

namespace melforge_test_half {

using namespace melforge::mel;

namespace {

/// The half nearest to `f` by exhaustive search over all finite halves in double, ties to the even bit pattern;
/// overflow (|f| >= 65520, the midpoint between the largest half and 2^16) gives infinity.
uint16_t nearest_half_by_search(float f) {
  const double x = std::abs(static_cast<double>(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (x >= 65520.0) return sign | 0x7c00;
  uint16_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double err = std::abs(static_cast<double>(half_bits_to_float(static_cast<uint16_t>(h))) - x);
    if (err < best_err || (err == best_err && (h & 1u) == 0)) {
      best_err = err;
      best = static_cast<uint16_t>(h);
    }
  }
  return sign | best;
}

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

TEST_CASE("half_bits_to_float decodes every class of half", "[half]") {
  CHECK(half_bits_to_float(0x0000) == 0.0f);
  CHECK(std::signbit(half_bits_to_float(0x8000)));
  CHECK(half_bits_to_float(0x3c00) == 1.0f);
  CHECK(half_bits_to_float(0xc000) == -2.0f);
  CHECK(half_bits_to_float(0x7bff) == 65504.0f);
  CHECK(half_bits_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(half_bits_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(half_bits_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(half_bits_to_float(0x7e00)));
  CHECK(std::isnan(half_bits_to_float(0x7c01)));
}

TEST_CASE("every half survives half -> float -> half", "[half]") {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = half_bits_to_float(bits);
    const bool is_nan = (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0;
    if (is_nan) {
      REQUIRE(std::isnan(f));
      REQUIRE((float_to_half_bits(f) & 0x7e00) == 0x7e00);
      REQUIRE((float_to_half_bits(f) & 0x8000) == (bits & 0x8000));
    } else {
      REQUIRE(float_to_half_bits(f) == bits);
    }
  }
}

TEST_CASE("float_to_half_bits rounds to nearest, ties to even", "[half]") {
  SECTION("exact values and ties between normals") {
    CHECK(float_to_half_bits(1.0f) == 0x3c00);
    CHECK(float_to_half_bits(-1.0f) == 0xbc00);
    CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);           // tie, 0x3c00 even
    CHECK(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);       // tie, rounds up to even
    CHECK(float_to_half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);
    CHECK(float_to_half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 0.0f)) == 0x3c00);
    CHECK(float_to_half_bits(2.0f - std::ldexp(1.0f, -12)) == 0x4000);           // carries into the exponent
    CHECK(float_to_half_bits(0.1f) == 0x2e66);
  }
  SECTION("overflow and the largest finite half") {
    CHECK(float_to_half_bits(65504.0f) == 0x7bff);
    CHECK(float_to_half_bits(65519.996f) == 0x7bff);
    CHECK(float_to_half_bits(65520.0f) == 0x7c00);
    CHECK(float_to_half_bits(-65520.0f) == 0xfc00);
    CHECK(float_to_half_bits(1e10f) == 0x7c00);
    CHECK(float_to_half_bits(std::numeric_limits<float>::max()) == 0x7c00);
    CHECK(float_to_half_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
    CHECK(float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  }
  SECTION("subnormals and underflow") {
    const float tiny = std::ldexp(1.0f, -24);
    CHECK(float_to_half_bits(tiny) == 0x0001);
    CHECK(float_to_half_bits(0.5f * tiny) == 0x0000);                    // tie between 0 and 1: even is 0
    CHECK(float_to_half_bits(std::nextafter(0.5f * tiny, 1.0f)) == 0x0001);
    CHECK(float_to_half_bits(-0.5f * tiny) == 0x8000);
    CHECK(float_to_half_bits(1.5f * tiny) == 0x0002);                    // tie between 1 and 2: even is 2
    CHECK(float_to_half_bits(2.5f * tiny) == 0x0002);                    // tie between 2 and 3: even is 2
    CHECK(float_to_half_bits(1023.5f * tiny) == 0x0400);                 // rounds up into the first normal
    CHECK(float_to_half_bits(1022.5f * tiny) == 0x03fe);
    CHECK(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400);
    CHECK(float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(float_to_half_bits(1e-30f) == 0x0000);
    CHECK(std::signbit(half_bits_to_float(float_to_half_bits(-0.0f))));
    CHECK(float_to_half_bits(-0.0f) == 0x8000);
  }
  SECTION("NaN stays NaN and keeps its sign") {
    CHECK((float_to_half_bits(std::numeric_limits<float>::quiet_NaN()) & 0x7e00) == 0x7e00);
    CHECK((float_to_half_bits(from_bits(0x7f800001u)) & 0x7e00) == 0x7e00);  // signalling NaN, payload below half's
    CHECK(float_to_half_bits(from_bits(0xffc00000u)) == 0xfe00);
  }
}

TEST_CASE("float_to_half_bits equals an exhaustive nearest-half search", "[half]") {
  std::vector<float> samples;
  for (uint32_t u = 0x33000000u - 64; u < 0x33000000u + 64; ++u) samples.push_back(from_bits(u));
  for (uint32_t u = 0x387fe000u; u < 0x38802000u; u += 0x100) samples.push_back(from_bits(u));
  for (uint32_t u = 0x477fe000u; u < 0x47800000u; u += 0x80) samples.push_back(from_bits(u));
  uint32_t state = 12345;
  for (int i = 0; i < 400; ++i) {
    state = state * 1664525u + 1013904223u;
    samples.push_back(from_bits(0x30000000u + state % 0x18000000u));
  }
  for (float f : samples) {
    CAPTURE(f);
    CHECK(float_to_half_bits(f) == nearest_half_by_search(f));
    CHECK(float_to_half_bits(-f) == nearest_half_by_search(-f));
  }
}

#if defined(__FLT16_MAX__)
TEST_CASE("float_to_half_bits equals the compiler's _Float16 conversion", "[half]") {
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    const float f = from_bits(static_cast<uint32_t>(u));
    if (std::isnan(f)) continue;
    const auto h = static_cast<_Float16>(f);
    if (std::bit_cast<uint16_t>(h) != float_to_half_bits(f)) ++mismatches;
  }
  for (uint32_t u = 0x33000000u; u < 0x38800000u; u += 7) {
    const float f = from_bits(u);
    if (std::bit_cast<uint16_t>(static_cast<_Float16>(f)) != float_to_half_bits(f)) ++mismatches;
  }
  CHECK(mismatches == 0);
}
#endif

}  // namespace melforge_test_half
