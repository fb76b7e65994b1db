#pragma once
/// Additive angular margin softmax (AAM-softmax, ArcFace), the loss of the speaker models (`--task verification`):
/// the cosine logits of a speaker model (ModelOutput::logits, models/speaker.h) get the margin on the target class's
/// angle and a scale, then cross-entropy. The form is the public VoxCeleb trainer's AAMSoftmax (easy_margin off).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace melforge::trainer {

/// The margined, scaled logits, [B, C]: scale * phi(cos) on each row's target column `labels[i]` and scale * cos
/// elsewhere, where, with theta = acos(cos), phi = cos(theta + margin) computed as cos * cos(m) - sin * sin(m) with
/// sin = sqrt(clamp(1 - cos^2, 1e-12, 1)) while cos > cos(pi - m), and phi = cos - sin(pi - m) * m beyond (so that
/// phi stays decreasing in theta). The 1e-12 floor (instead of 0) keeps the gradient finite at cos = +-1, where the
/// exact derivative of cos(theta + m) is infinite; it changes sin only where 1 - cos^2 < 1e-12 (in float32: only at
/// cos = +-1 exactly). Margin 0 gives scale * cos exactly.
///
/// `cosine`: [B, C] float, half, bfloat16 or double (computed in float32, or in double for double input; the result
/// has that type). `labels`: int64 [B], each in [0, C) (not checked here: gather reports an index out of range).
/// `margin`: radians, in [0, pi/2); `scale` > 0. Throws InvalidArgument for other shapes, types or parameters.
at::Tensor aam_logits(const at::Tensor& cosine, const at::Tensor& labels, double margin, double scale);

/// The mean over the batch of the cross-entropy of aam_logits(cosine, labels, margin, scale) against `labels`: a
/// scalar of aam_logits' type. Throws InvalidArgument as aam_logits does.
at::Tensor aam_softmax_loss(const at::Tensor& cosine, const at::Tensor& labels, double margin, double scale);

/// The margin of an optional linear warm-up at optimizer step `step` (0-based): margin * min(1, step /
/// warmup_steps), rising from 0 at step 0 to `margin` at step `warmup_steps` and after; `margin` itself when
/// warmup_steps is 0 (no warm-up). Throws InvalidArgument for a negative step or warmup_steps.
double warmup_margin(double margin, int64_t step, int64_t warmup_steps);

}  // namespace melforge::trainer
