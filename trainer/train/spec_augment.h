#pragma once
/// SpecAugment (Park et al. 2019) time and frequency masking of a batch of log-mel spectrograms, drawn on the
/// batch's device with tensor ops (no per-element host loop, no host sync).
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// How many masks of which maximum width; all 0 (the default) leaves the input unchanged.
struct SpecAugmentOptions {
  /// Time masks per example; >= 0.
  int64_t time_masks = 0;
  /// Maximum width of one time mask, frames; each mask's width is uniform in [0, time_width]; >= 0.
  int64_t time_width = 0;
  /// Frequency masks per example; >= 0.
  int64_t freq_masks = 0;
  /// Maximum width of one frequency mask, mel bands; each mask's width is uniform in [0, freq_width]; >= 0.
  int64_t freq_width = 0;

  /// Whether any mask can cover something (a mask count and its width both > 0).
  bool enabled() const { return (time_masks > 0 && time_width > 0) || (freq_masks > 0 && freq_width > 0); }
  /// Throws InvalidArgument naming the flag when a value is negative.
  void validate() const;
};

/// Registers --spec-time-masks --spec-time-width --spec-freq-masks --spec-freq-width.
void add_options(boost::program_options::options_description& desc, SpecAugmentOptions& opts);

/// A masked copy of `x`, [B, M, T] (or [B, 1, M, T]), any float dtype, on any device. For each example
/// independently, `time_masks` bands of frames [s, s + w) and `freq_masks` bands of mel rows are drawn, w uniform in
/// [0, min(width, size)] and s uniform in [0, size - w]; masks may overlap. With `lengths` (int64 [B], real frames
/// per row, on any device; undefined: every frame real) a row's time axis is its first lengths[b] frames: time masks
/// lie within them and frequency masks cover them only, so padding is never masked and no mask falls in padding
/// alone. Masked cells are set to the mean of that example's input over its real cells (M x lengths[b]; before
/// masking), a neutral level for log-mel values, where 0 is not. `gen`: a generator of x's device (the device's
/// default generator when null). Returns `x` itself when `opts` is not enabled(). Throws InvalidArgument for another
/// shape.
at::Tensor spec_augment(const at::Tensor& x, const SpecAugmentOptions& opts, at::Generator* gen = nullptr,
                        const at::Tensor& lengths = {});

}  // namespace melforge::trainer
