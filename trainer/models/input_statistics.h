#pragma once
/// The input normalisation's statistics (Classifier::set_input_normalization): the mean and standard deviation of
/// every real value of a split's spectrograms, padding left out.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace melforge::trainer {

/// Mean and standard deviation of the values added so far, accumulated in double precision batch by batch (each
/// batch's mean and sum of squared deviations, merged with Chan et al.'s pairwise update, so that values far from 0
/// lose no precision to cancellation).
class InputStatistics {
 public:
  /// Adds the real values of `x`: [B, n_mels, T] or [B, 1, n_mels, T] spectrograms (any float type, any device),
  /// row b's real frames being its first lengths[b] (int64 [B], 0 <= lengths[b] <= T; undefined: every frame).
  /// Throws InvalidArgument for another shape or bad lengths.
  void add(const at::Tensor& x, const at::Tensor& lengths = {});
  /// Adds every value of `frames`, [N, n_mels] frame-major (a schema-3 split's frames: all real).
  void add_frames(const at::Tensor& frames);
  /// Values added so far.
  double count() const { return count_; }
  /// {mean, population standard deviation} of the values added; {0, 1} when none were, standard deviation 1 when
  /// they are all equal (Classifier::set_input_normalization needs std > 0).
  std::pair<double, double> mean_std() const;

 private:
  /// Merges a group of `n` values of mean `mean` and sum of squared deviations `m2`.
  void merge(double n, double mean, double m2);
  double count_ = 0, mean_ = 0, m2_ = 0;
};

}  // namespace melforge::trainer
