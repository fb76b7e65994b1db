#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "verification/verification.h"

namespace melforge::verification {

namespace {

using Colour = std::array<uint8_t, 3>;

constexpr int64_t kMargin = 10;
constexpr Colour kGrid = {225, 225, 225}, kDiagonal = {150, 150, 150}, kFrame = {0, 0, 0}, kCurve = {20, 70, 200},
                 kEer = {220, 30, 30};

/// Acklam's rational approximation of the normal quantile (relative error below 1.2e-9).
double probit_estimate(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double p_low = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  };
  if (p < p_low) return tail(std::sqrt(-2 * std::log(p)));
  if (p > 1 - p_low) return -tail(std::sqrt(-2 * std::log1p(-p)));
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

class Canvas {
 public:
  explicit Canvas(int64_t size) {
    image_.width = image_.height = size;
    image_.rgb.assign(static_cast<std::size_t>(size * size * 3), 255);
  }

  void set(int64_t x, int64_t y, const Colour& c) {
    if (x < 0 || y < 0 || x >= image_.width || y >= image_.height) return;
    std::copy(c.begin(), c.end(), image_.rgb.begin() + (y * image_.width + x) * 3);
  }

  void line(double x0, double y0, double x1, double y1, const Colour& c) {
    const auto steps = static_cast<int64_t>(std::ceil(std::max(std::abs(x1 - x0), std::abs(y1 - y0))));
    for (int64_t i = 0; i <= steps; ++i) {
      const double t = steps == 0 ? 0.0 : static_cast<double>(i) / static_cast<double>(steps);
      set(std::lround(x0 + t * (x1 - x0)), std::lround(y0 + t * (y1 - y0)), c);
    }
  }

  RgbImage take() { return std::move(image_); }

 private:
  RgbImage image_;
};

/// Pixel coordinate along an axis of a probability, clamped to the axis range: 0 at kDetAxisMin, `span` at
/// kDetAxisMax.
double axis_pixel(double p, double span) {
  static const double lo = probit(kDetAxisMin), hi = probit(kDetAxisMax);
  return (probit(std::clamp(p, kDetAxisMin, kDetAxisMax)) - lo) / (hi - lo) * span;
}

}  // namespace

double probit(double p) {
  if (!(p > 0 && p < 1)) throw InvalidArgument("probit: p must be in (0, 1), got " + std::to_string(p));
  const double x = probit_estimate(p);
  const double e = 0.5 * std::erfc(-x / std::numbers::sqrt2) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

RgbImage det_image(const std::vector<DetPoint>& det, double eer) {
  Canvas canvas(kDetImageSize);
  const double span = static_cast<double>(kDetImageSize - 1 - 2 * kMargin);
  const double lo = static_cast<double>(kMargin), hi = lo + span;
  auto px = [&](double p_fa) { return lo + axis_pixel(p_fa, span); };
  auto py = [&](double p_miss) { return hi - axis_pixel(p_miss, span); };
  for (const double g : {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4}) {
    canvas.line(px(g), lo, px(g), hi, kGrid);
    canvas.line(lo, py(g), hi, py(g), kGrid);
  }
  canvas.line(lo, hi, hi, lo, kDiagonal);
  for (const auto& [x0, y0, x1, y1] : {std::array{lo, lo, hi, lo}, std::array{hi, lo, hi, hi},
                                       std::array{hi, hi, lo, hi}, std::array{lo, hi, lo, lo}})
    canvas.line(x0, y0, x1, y1, kFrame);
  for (std::size_t k = 1; k < det.size(); ++k)
    canvas.line(px(det[k - 1].p_fa), py(det[k - 1].p_miss), px(det[k].p_fa), py(det[k].p_miss), kCurve);
  if (std::isfinite(eer)) {
    const int64_t cx = std::lround(px(eer)), cy = std::lround(py(eer));
    for (int64_t dy = -3; dy <= 3; ++dy)
      for (int64_t dx = -3; dx <= 3; ++dx) canvas.set(cx + dx, cy + dy, kEer);
  }
  return canvas.take();
}

void write_det_png(const std::filesystem::path& path, const std::vector<DetPoint>& det, double eer) {
  write_file_atomically(path, encode_png(det_image(det, eer)));
}

}  // namespace melforge::verification
