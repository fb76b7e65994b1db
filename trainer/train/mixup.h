#pragma once
/// mixup (Zhang et al. 2018) of a training batch of log-mel spectrograms: each example blended with a partner of the
/// same batch, x = lambda x + (1 - lambda) x[perm], and the loss blended the same way, with one lambda per batch drawn
/// from Beta(alpha, alpha) on the batch's device (tensor ops, no host sync).
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// --mixup ALPHA; 0 (the default) leaves the training batches and the loss unchanged and draws nothing.
struct MixupOptions {
  /// The parameter of the symmetric Beta(alpha, alpha) that lambda is drawn from; >= 0 and finite, 0 = off.
  double alpha = 0.0;

  /// Whether mixup is on (alpha > 0).
  bool enabled() const { return alpha > 0.0; }
  /// Throws InvalidArgument naming --mixup when alpha is negative, NaN or infinite.
  void validate() const;
};

/// Registers --mixup.
void add_options(boost::program_options::options_description& desc, MixupOptions& opts);

/// The mixing of one batch.
struct MixupDraw {
  /// The weight of the batch itself, lambda in [0, 1]: a float32 scalar tensor on the batch's device.
  at::Tensor lambda;
  /// The partner of each example: a permutation of [0, B), int64 [B] on the batch's device.
  at::Tensor perm;
};

/// Draws lambda ~ Beta(alpha, alpha) (the first component of a Dirichlet(alpha, alpha) sample, which keeps lambda
/// in [0, 1] for small alpha) and then a uniform permutation of `batch` examples, both from `gen` (a generator of
/// `device`; the device's default generator when null). Throws InvalidArgument when alpha is not > 0 and finite or
/// batch < 0.
MixupDraw draw_mixup(int64_t batch, double alpha, at::Device device, at::Generator* gen = nullptr);

/// lambda * x + (1 - lambda) * x[perm] along dim 0, in x's dtype; `x`: [B, ...] on the draw's device.
at::Tensor mix_batch(const at::Tensor& x, const MixupDraw& draw);

/// The mixup loss from the loss against the batch's own labels (`own`) and against its partners' labels
/// (`partner`, i.e. labels[perm]): lambda * own + (1 - lambda) * partner, float32 scalars.
at::Tensor mix_losses(const at::Tensor& own, const at::Tensor& partner, const MixupDraw& draw);

/// Real frames of the mixed rows: max(lengths, lengths[perm]), int64 [B] (the union: a mixed row is real wherever
/// either of its two rows is; there the shorter row contributes its padding, the silence value).
at::Tensor mix_lengths(const at::Tensor& lengths, const MixupDraw& draw);

/// Mixed multi-label targets: lambda * t + (1 - lambda) * t[perm], float32 [B, C] for `targets` [B, C].
at::Tensor mix_targets(const at::Tensor& targets, const MixupDraw& draw);

}  // namespace melforge::trainer
