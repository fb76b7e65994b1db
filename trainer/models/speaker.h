#pragma once
/// What the speaker-embedding models (`--model resnet-se`, `--model ecapa`) share: the squeeze-excitation gate, the
/// attentive statistics pooling over time, and the SpeakerModel base with its additive-angular-margin (AAM) head.
///
/// A speaker model's forward returns ModelOutput{logits, detection (undefined), embedding}: `embedding` [B, E] is the
/// raw (not normalised) speaker embedding, `logits` [B, num_classes] the cosine similarities between the
/// L2-normalised embedding and the L2-normalised rows of `aam.weight`, in [-1, 1] (up to rounding). No scale and no
/// margin are applied in the model: the loss (train/aam.h) adds them. Parameter names are those of the twins in
/// python/melforge/models.py (ResNetSE, Ecapa), so a state dict moves between the two unchanged.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>

#include "models/model.h"
#include "models/sync_batch_norm.h"

namespace melforge::trainer {

/// Squeeze-excitation: x * sigmoid(fc2(relu(fc1(mean of x over every axis after the channels)))), the mean over the
/// real time steps only (the last axis). Modules fc1 (channels -> bottleneck) and fc2 (bottleneck -> channels),
/// linear layers with bias.
class SqueezeExciteImpl : public torch::nn::Module {
 public:
  /// A gate over `channels` channels through `bottleneck` hidden units (both >= 1).
  SqueezeExciteImpl(int64_t channels, int64_t bottleneck);
  /// `x`: [B, channels, ..., T] (any number of trailing axes, at least one, the last one time); `lengths`: int64
  /// [B], real steps of the last axis (undefined: all). Returns the gated x, same shape.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& lengths = {});
  /// Parameters of a gate of `channels` through `bottleneck`.
  static double parameters(double channels, double bottleneck);

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(SqueezeExcite);

/// Attentive statistics pooling over time with channel-wise attention: weights w = softmax over time of
/// conv2(f(bn(relu(conv1(a))))), where a = x (the ResNetSE34V2 form, f the identity) or, with global context, a =
/// [x; mean_t(x); std_t(x)] stacked on the channel axis with f = tanh (the ECAPA-TDNN form; std_t unbiased, its
/// variance floored at eps); then mu = sum_t x w and sigma = sqrt(max(sum_t x^2 w - mu^2, eps)). With lengths, t runs
/// over the real steps only: the softmax's logits are -inf at the padding, the global context's mean and standard
/// deviation are over the real steps (the variance divided by max(n - 1, 1) for n real steps, so that one real step
/// gives std sqrt(eps), not 0 / 0). Modules conv1 (1x1 conv, a's channels -> hidden), bn (batch norm over hidden),
/// conv2 (1x1 conv, hidden -> channels), all with bias.
class AttentiveStatsPoolImpl : public torch::nn::Module {
 public:
  /// Pooling of `channels` features (D) through `hidden` attention units; `global_context` as above; `eps` floors
  /// the variances.
  AttentiveStatsPoolImpl(int64_t channels, int64_t hidden, bool global_context, double eps);
  /// `x`: [B, D, T]; `lengths`: int64 [B], real steps (undefined: all). Returns [mu, sigma] concatenated, [B, 2 D].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& lengths = {});
  /// Size of the pooling of `channels` features through `hidden` units over `steps` time steps.
  static ModelSize size(double channels, double hidden, bool global_context, double steps);

 private:
  /// The pooling of `x` [B, D, T] (zeros at the padding) with `mask` (bool [B, 1, T], true at real steps; undefined:
  /// every step real).
  at::Tensor pool(const at::Tensor& x, const at::Tensor& mask);

  bool global_context_;
  double eps_;
  torch::nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  SyncBatchNorm1d bn_{nullptr};
};
TORCH_MODULE(AttentiveStatsPool);

/// The common part of the speaker models: the AAM head `aam` (a linear layer without bias, weight [num_classes,
/// embedding_dim], Xavier-normal initialised as the public VoxCeleb trainer's AAMSoftmax does) and the output it
/// gives an embedding.
class SpeakerModel : public Classifier {
 public:
  /// Registers `aam` for `embedding_dim` (E >= 1) and `num_classes` (>= 2; InvalidArgument otherwise, naming
  /// `model`).
  SpeakerModel(const std::string& model, int64_t embedding_dim, int64_t num_classes);
  /// Width of the embedding (E).
  int64_t embedding_dim() const { return embedding_dim_; }
  /// The AAM head's class centres, [num_classes, E] (not normalised).
  const at::Tensor& aam_weight() const { return aam_->weight; }

 protected:
  /// {cosine logits [B, num_classes], undefined detection, embedding} for `embedding` [B, E].
  ModelOutput speaker_output(const at::Tensor& embedding) const;

 private:
  int64_t embedding_dim_;
  torch::nn::Linear aam_{nullptr};
};

/// Parameters of an `in` -> `out` convolution with a `kernel`-element kernel and bias (bias false: without).
inline double conv_parameters(double in, double out, double kernel, bool bias = true) {
  return in * out * kernel + (bias ? out : 0);
}
/// Parameters of a batch norm over `channels` (weight and bias; the running statistics are buffers).
inline double batch_norm_parameters(double channels) { return 2 * channels; }

}  // namespace melforge::trainer
