#pragma once
/// IEEE 754 binary16 ("half") conversions on the host, bit-exact with a hardware round-to-nearest-even conversion
/// (CUDA's __float2half_rn, x86's vcvtps2ph with rounding mode 0).
#include <bit>
#include <cstdint>

namespace melforge::mel {

namespace half_detail {
/// All ones when `b`, else zero.
constexpr uint32_t mask(bool b) { return static_cast<uint32_t>(-static_cast<int32_t>(b)); }
}  // namespace half_detail

/// Nearest half to `f`, ties to even, as its 16 bits. Overflow (|f| >= 65520) gives infinity, values at or below
/// 2^-25 in magnitude give a signed zero, NaN stays NaN (quiet, sign and top payload bits kept).
/// Every case is computed and the result picked with bit masks, with no branch, so that loops over it vectorise.
constexpr uint16_t float_to_half_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal halves: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even by adding 0xfff
  // plus the lowest kept bit; a carry may ripple into the exponent, which is then the correct result.
  const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal halves (|f| < 2^-14): adding 0.5f, whose ulp is 2^-24 (the subnormal half's step), rounds |f| to a
  // multiple of 2^-24 in the FPU's round-to-nearest-even; the low bits of the sum are then the half's bits.
  const uint32_t subnormal = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  const uint32_t nan_bits = 0x200u | ((a >> 13) & 0x3ffu);
  const uint32_t special = 0x7c00u | (half_detail::mask(a > 0x7f800000u) & nan_bits);
  const uint32_t is_subnormal = half_detail::mask(a < 0x38800000u);
  const uint32_t is_special = half_detail::mask(a >= 0x477ff000u);
  uint32_t h = (is_subnormal & subnormal) | (~is_subnormal & normal);
  h = (is_special & special) | (~is_special & h);
  return static_cast<uint16_t>(sign | h);
}

/// The float equal to the half with bits `h` (exact: every half is a float). NaN payloads are kept.
constexpr float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  uint32_t e = 113u;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

}  // namespace melforge::mel
