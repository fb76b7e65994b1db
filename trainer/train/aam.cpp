#include "train/aam.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "melforge/common/errors.h"
#include "util.h"

namespace melforge::trainer {

namespace {

constexpr double kPi = 3.14159265358979323846;

void check_aam(const at::Tensor& cosine, const at::Tensor& labels, double margin, double scale) {
  if (!(margin >= 0.0 && margin < kPi / 2))
    throw InvalidArgument("--margin must be in [0, pi/2) radians, got " + std::to_string(margin));
  if (!(scale > 0.0 && std::isfinite(scale)))
    throw InvalidArgument("--scale must be finite and > 0, got " + std::to_string(scale));
  if (cosine.dim() != 2 || !at::isFloatingType(cosine.scalar_type()))
    throw InvalidArgument("aam: cosine logits must be floating point [B, C], got " + shape_text(cosine.sizes()));
  if (labels.dim() != 1 || labels.scalar_type() != at::kLong || labels.size(0) != cosine.size(0))
    throw InvalidArgument("aam: labels must be int64 [B] with B = " + std::to_string(cosine.size(0)) + ", got " +
                          shape_text(labels.sizes()));
}

}  // namespace

at::Tensor aam_logits(const at::Tensor& cosine, const at::Tensor& labels, double margin, double scale) {
  check_aam(cosine, labels, margin, scale);
  const at::Tensor cos = cosine.scalar_type() == at::kDouble ? cosine : cosine.to(at::kFloat);
  if (margin == 0.0) return cos * scale;
  const at::Tensor index = labels.unsqueeze(1);
  const at::Tensor target = cos.gather(1, index);
  const at::Tensor sin = at::sqrt((1.0 - target * target).clamp(1e-12, 1.0));
  const at::Tensor phi = target * std::cos(margin) - sin * std::sin(margin);
  const at::Tensor margined = at::where(target > std::cos(kPi - margin), phi, target - std::sin(kPi - margin) * margin);
  return cos.scatter(1, index, margined) * scale;
}

at::Tensor aam_softmax_loss(const at::Tensor& cosine, const at::Tensor& labels, double margin, double scale) {
  return at::cross_entropy_loss(aam_logits(cosine, labels, margin, scale), labels);
}

double warmup_margin(double margin, int64_t step, int64_t warmup_steps) {
  if (step < 0 || warmup_steps < 0)
    throw InvalidArgument("margin warm-up: step and warm-up steps must be >= 0, got " + std::to_string(step) +
                          " and " + std::to_string(warmup_steps));
  if (warmup_steps == 0) return margin;
  return margin * std::min(1.0, static_cast<double>(step) / static_cast<double>(warmup_steps));
}

}  // namespace melforge::trainer
