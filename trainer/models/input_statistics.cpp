#include "models/input_statistics.h"

#include <ATen/ops/where.h>

#include <cmath>

#include "melforge/common/errors.h"
#include "models/time_mask.h"
#include "util.h"

namespace melforge::trainer {

void InputStatistics::add(const at::Tensor& x, const at::Tensor& lengths) {
  if (!(x.dim() == 3 || (x.dim() == 4 && x.size(1) == 1)))
    throw InvalidArgument("input statistics: spectrograms of shape " + shape_text(x.sizes()) +
                          ", expected [B, n_mels, T] or [B, 1, n_mels, T]");
  const at::Tensor v = (x.dim() == 4 ? x.squeeze(1) : x).to(at::kDouble);
  if (!lengths.defined()) {
    add_frames(v.transpose(1, 2).reshape({-1, v.size(1)}));
    return;
  }
  if (lengths.scalar_type() != at::kLong || lengths.dim() != 1 || lengths.size(0) != v.size(0))
    throw InvalidArgument("input statistics: lengths must be an int64 tensor of shape [" + std::to_string(v.size(0)) +
                          "], got " + shape_text(lengths.sizes()));
  const at::Tensor len = lengths.to(v.device());
  if (v.size(0) > 0 && (len < 0).logical_or(len > v.size(2)).any().item<bool>())
    throw InvalidArgument("input statistics: lengths outside [0, " + std::to_string(v.size(2)) + "]");
  const double n = len.sum().item<double>() * static_cast<double>(v.size(1));
  if (n == 0) return;
  const at::Tensor mask = time_mask(len, v.size(2)).unsqueeze(1);
  const double mean = at::where(mask, v, 0).sum().item<double>() / n;
  const double m2 = at::where(mask, (v - mean).square(), 0).sum().item<double>();
  merge(n, mean, m2);
}

void InputStatistics::add_frames(const at::Tensor& frames) {
  if (frames.numel() == 0) return;
  const at::Tensor v = frames.to(at::kDouble);
  const double n = static_cast<double>(v.numel());
  const double mean = v.mean().item<double>();
  merge(n, mean, (v - mean).square().sum().item<double>());
}

void InputStatistics::merge(double n, double mean, double m2) {
  const double total = count_ + n, delta = mean - mean_;
  mean_ += delta * n / total;
  m2_ += m2 + delta * delta * count_ * n / total;
  count_ = total;
}

std::pair<double, double> InputStatistics::mean_std() const {
  if (count_ == 0) return {0.0, 1.0};
  const double sd = std::sqrt(m2_ / count_);
  return {mean_, sd > 0 ? sd : 1.0};
}

}  // namespace melforge::trainer
