#include "mel/mel_compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "mel/half.h"
#include "melforge/common/errors.h"

namespace melforge::mel {

namespace {

/// Element `i` of `data` (`dtype`; float16 as half bits) as a float.
float element(const void* data, int64_t i, DType dtype) {
  if (dtype == DType::float16) {
    uint16_t h = 0;
    std::memcpy(&h, static_cast<const uint8_t*>(data) + i * 2, 2);
    return half_bits_to_float(h);
  }
  float v = 0;
  std::memcpy(&v, static_cast<const uint8_t*>(data) + i * 4, 4);
  return v;
}

/// The power a stored value stands for: the log of `args` undone.
double to_power(float v, const MelArgs& args) {
  switch (args.log) {
    case LogMode::db: return std::pow(10.0, static_cast<double>(v) * args.power / 20.0);
    case LogMode::ln: return std::exp(static_cast<double>(v));
    case LogMode::none: break;
  }
  return v;
}

/// Largest |value| over the finite values of `count` elements of `data`.
double max_abs_finite(const void* data, int64_t count, DType dtype) {
  double m = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = element(data, i, dtype);
    if (std::isfinite(v)) m = std::max(m, static_cast<double>(std::abs(v)));
  }
  return m;
}

}  // namespace

double element_diff(float cpu, float device) {
  if (cpu == device || (std::isnan(cpu) && std::isnan(device))) return 0.0;
  const double d = std::abs(static_cast<double>(cpu) - static_cast<double>(device));
  return std::isfinite(d) ? d : std::numeric_limits<double>::infinity();
}

bool WorstElement::offer(int64_t i, float cpu_value, float device_value, double difference, double limit,
                         bool is_outside) {
  const bool worse = is_outside ? (!outside || difference > diff) : (!outside && difference > diff);
  if (index >= 0 && !worse) return false;
  index = i;
  cpu = cpu_value;
  device = device_value;
  diff = difference;
  bound = limit;
  outside = is_outside;
  return true;
}

std::string MelTolerance::text() const {
  std::ostringstream s;
  s << "|device - cpu| <= " << rel << " |cpu| + " << abs << ", or power within " << frame_power
    << " of the frame's loudest band";
  return s.str();
}

MelTolerance mel_tolerance(DType dtype, LogMode log, double max_abs_cpu) {
  MelTolerance t;
  t.rel = dtype == DType::float16 ? 2e-3 : 2e-4;
  t.abs = log == LogMode::none ? 1e-5 * max_abs_cpu : 5e-3;
  return t;
}

MelDiff compare_mel(const void* cpu, const void* device, int64_t segments, int n_mels, int n_frames, DType dtype,
                    const MelArgs& args) {
  if (n_mels < 1 || n_frames < 1 || segments < 0)
    throw InvalidArgument("compare_mel: " + std::to_string(segments) + " segments of " + std::to_string(n_mels) +
                          " x " + std::to_string(n_frames) + " elements");
  const int64_t per_segment = int64_t{n_mels} * n_frames;
  MelDiff d;
  d.elements = segments * per_segment;
  d.tolerance = mel_tolerance(dtype, args.log, max_abs_finite(cpu, d.elements, dtype));
  std::vector<double> peak(static_cast<std::size_t>(n_frames));
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t base = s * per_segment;
    std::fill(peak.begin(), peak.end(), 0.0);
    for (int64_t i = 0; i < per_segment; ++i) {
      const double p = to_power(element(cpu, base + i, dtype), args);
      double& f = peak[static_cast<std::size_t>(i % n_frames)];
      if (std::isfinite(p)) f = std::max(f, p);
    }
    for (int64_t i = 0; i < per_segment; ++i) {
      const float a = element(cpu, base + i, dtype);
      const float b = element(device, base + i, dtype);
      const double diff = element_diff(a, b);
      const double bound = d.tolerance.rel * std::abs(static_cast<double>(a)) + d.tolerance.abs;
      const double frame_bound = d.tolerance.frame_power * peak[static_cast<std::size_t>(i % n_frames)];
      const bool outside =
          diff > bound && !(std::isfinite(diff) && std::abs(to_power(a, args) - to_power(b, args)) <= frame_bound);
      d.max_abs_diff = std::max(d.max_abs_diff, diff);
      if (outside) ++d.outside;
      d.worst.offer(base + i, a, b, diff, bound, outside);
    }
  }
  return d;
}

}  // namespace melforge::mel
