#pragma once
/// `--model resnet-se`: a speaker-embedding network in the layout of the public VoxCeleb trainer's ResNetSE34V2
/// ("Thin ResNet34"): a 3x3 stem, four stages of squeeze-excitation basic residual blocks (3, 4, 6, 3 blocks; stride 1,
/// then 2 x 2 on both the mel and the time axis at the first block of stages 2 to 4), attentive statistics pooling
/// over the remaining time steps and a linear layer to the embedding; the AAM head of SpeakerModel gives the cosine
/// logits (see models/speaker.h for the outputs).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <array>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "models/speaker.h"
#include "models/sync_batch_norm.h"

namespace melforge::trainer {

/// Shape and widths of ResNetSE. The input shape comes from the dataset's attributes (ResNetSEConfig::from_info).
struct ResNetSEConfig {
  /// Mel bands of one input spectrogram (M); >= 8 (three stride-2 stages).
  int64_t n_mels = 64;
  /// Frames of the training examples (the tile width); >= 8. Inputs may have any T >= 1.
  int64_t n_frames = 200;
  /// Classes (speakers) of the AAM head; >= 2.
  int64_t num_classes = 2;
  /// `half` (filters 32, 64, 128, 256: ResNetSE34V2) or `quarter` (16, 32, 64, 128: ResNetSE34L's widths).
  std::string width = "half";
  /// Width of the embedding (E); >= 1.
  int64_t embedding_dim = 192;

  /// Blocks per stage.
  static constexpr std::array<int64_t, 4> kBlocks = {3, 4, 6, 3};
  /// Hidden units of the pooling's attention.
  static constexpr int64_t kAttention = 128;
  /// Squeeze-excitation reduction: a block of p filters gates through p / 8 units.
  static constexpr int64_t kReduction = 8;
  /// Variance floor of the pooling.
  static constexpr double kEps = 1e-5;

  /// A config for spectrograms of `info` (n_mels, n_frames) and `num_classes` classes, default widths.
  static ResNetSEConfig from_info(const MelInfo& info, int64_t num_classes);
  /// Reads the fields config_json() writes; throws FormatError when one is missing or of the wrong type.
  static ResNetSEConfig from_json(const nlohmann::json& j);
  /// Throws InvalidArgument when a field is out of range.
  void validate() const;
  /// Filters of the four stages for `width`.
  std::array<int64_t, 4> filters() const;
  /// Mel rows after the three stride-2 stages: ceil(M / 8) (each 3x3 stride-2 convolution with padding 1 maps n to
  /// ceil(n / 2)).
  int64_t out_mels() const;
  /// Time steps after the three stride-2 stages: ceil(T / 8).
  int64_t out_frames() const;
  /// Features per time step the pooling sees: filters()[3] * out_mels() (channel-major).
  int64_t pool_features() const { return filters()[3] * out_mels(); }
  /// The model's size before it is built (every weight and bias; activations of one input segment).
  ModelSize size() const;
};

/// A basic residual block with squeeze-excitation, as the public trainer's SEBasicBlock: out = bn1(relu(conv1(x)))
/// (3x3, stride s), out = se(bn2(conv2(out))) (3x3), relu(out + shortcut), the shortcut being x, or
/// `downsample` (a Sequential of a 1x1 stride-s convolution without bias and a batch norm) when the stride or the
/// width changes. Convolutions without bias. Modules conv1, bn1, conv2, bn2, se, downsample. With lengths, the
/// padding is zeros before each 3x3 convolution and left out of the squeeze-excitation's mean.
class SEBasicBlockImpl : public torch::nn::Module {
 public:
  /// A block from `in` to `planes` filters with stride `stride` (both axes).
  SEBasicBlockImpl(int64_t in, int64_t planes, int64_t stride);
  /// `x`: [B, in, H, W] (W: time); `lengths`: int64 [B], real steps of W (undefined: all). Returns [B, planes,
  /// ceil(H / stride), ceil(W / stride)], whose real steps are output_lengths(lengths).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& lengths = {});
  /// Real steps of the output for `lengths` real steps of an input of `frames` steps: downsampled_lengths by the
  /// stride (undefined stays undefined).
  at::Tensor output_lengths(const at::Tensor& lengths, int64_t frames) const;
  /// Parameters of such a block.
  static double parameters(double in, double planes, bool downsample);

 private:
  int64_t stride_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  SyncBatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  SqueezeExcite se_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(SEBasicBlock);

/// The network: input normalisation, conv1 (3x3, 1 -> f0, bias) ReLU bn1, layer1..layer4 (ModuleLists of
/// SEBasicBlock), the map [B, f3, ceil(M/8), ceil(T/8)] reshaped channel-major to [B, f3 * ceil(M/8), ceil(T/8)],
/// `pool` (AttentiveStatsPool without global context) over the ceil(lengths / 8) real steps, `fc` (linear 2 D -> E):
/// the embedding; then `aam`.
class ResNetSEImpl : public SpeakerModel {
 public:
  /// Builds the layers for `config` (validated first; throws InvalidArgument). Parameters are initialised by
  /// LibTorch's defaults (the AAM head: Xavier normal) from the global generator.
  explicit ResNetSEImpl(const ResNetSEConfig& config);
  /// `x`: [B, n_mels, T] or [B, 1, n_mels, T], float, T >= 1; `lengths` as Classifier::forward. Throws
  /// InvalidArgument for another shape or bad lengths.
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override;
  /// "resnet-se".
  std::string kind() const override { return "resnet-se"; }
  /// {"model": "resnet-se", "n_mels", "n_frames", "num_classes", "width", "embedding_dim"}.
  nlohmann::json architecture_json() const override;
  /// The configuration the model was built with.
  const ResNetSEConfig& config() const { return config_; }

 private:
  ResNetSEConfig config_;
  torch::nn::Conv2d conv1_{nullptr};
  SyncBatchNorm2d bn1_{nullptr};
  std::array<torch::nn::ModuleList, 4> layers_{nullptr, nullptr, nullptr, nullptr};
  AttentiveStatsPool pool_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNetSE);

}  // namespace melforge::trainer
