#pragma once
/// `--model ecapa`: ECAPA-TDNN (Desplanques et al. 2020, in the layout of the public VoxCeleb ECAPA trainers): the
/// n_mels bands are the feature axis of 1-d convolutions over time; a 5-tap stem, three SE-Res2Net blocks with
/// dilations 2, 3, 4 (each block's input is the sum of the stem's and the previous blocks' outputs), multi-layer
/// feature aggregation (a 1x1 convolution over the three blocks' outputs, stacked), attentive statistics pooling
/// with global context, batch norm, a linear layer to the embedding and a batch norm; the AAM head of SpeakerModel
/// gives the cosine logits (see models/speaker.h for the outputs).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <array>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "models/speaker.h"

namespace melforge::trainer {

/// Shape and widths of Ecapa. The input shape comes from the dataset's attributes (EcapaConfig::from_info).
struct EcapaConfig {
  /// Mel bands of one input spectrogram (M, the convolutions' input channels); >= 1.
  int64_t n_mels = 80;
  /// Frames of the training examples (the tile width); >= 2. Inputs may have any T >= 1 (the global context's
  /// standard deviation of one step is sqrt(kEps), AttentiveStatsPool).
  int64_t n_frames = 200;
  /// Classes (speakers) of the AAM head; >= 2.
  int64_t num_classes = 2;
  /// Channels of the stem and the SE-Res2Net blocks (C); a multiple of kScale, >= kScale. The aggregation has 3 C
  /// channels (1536 at the default 512).
  int64_t channels = 512;
  /// Width of the embedding (E); >= 1.
  int64_t embedding_dim = 192;

  /// Res2Net scale: a block splits its C channels into kScale groups of C / kScale.
  static constexpr int64_t kScale = 8;
  /// Dilations of the three blocks' 3-tap convolutions.
  static constexpr std::array<int64_t, 3> kDilations = {2, 3, 4};
  /// Hidden units of each block's squeeze-excitation.
  static constexpr int64_t kSeBottleneck = 128;
  /// Hidden units of the pooling's attention.
  static constexpr int64_t kAttention = 256;
  /// Variance floor of the pooling.
  static constexpr double kEps = 1e-4;

  /// A config for spectrograms of `info` (n_mels, n_frames) and `num_classes` classes, default widths.
  static EcapaConfig from_info(const MelInfo& info, int64_t num_classes);
  /// Reads the fields config_json() writes; throws FormatError when one is missing or of the wrong type.
  static EcapaConfig from_json(const nlohmann::json& j);
  /// Throws InvalidArgument when a field is out of range.
  void validate() const;
  /// The model's size before it is built (every weight and bias; activations of one input segment).
  ModelSize size() const;
};

/// An SE-Res2Net block on [B, C, T]: out = bn1(relu(conv1(x))) (1x1); split into kScale groups s_0..s_7 of
/// C / kScale channels; y_0 = bns.0(relu(convs.0(s_0))), y_i = bns.i(relu(convs.i(y_{i-1} + s_i))) for i = 1..6
/// (3-tap, dilation d, padding d); out = bn3(relu(conv3([y_0 .. y_6, s_7]))) (1x1), then se(out) + x.
/// Convolutions with bias. Modules conv1, bn1, convs (ModuleList), bns (ModuleList), conv3, bn3, se. With lengths,
/// the padding is zeros before each 3-tap convolution and left out of the squeeze-excitation's mean.
class SERes2BlockImpl : public torch::nn::Module {
 public:
  /// A block of `channels` channels (a multiple of EcapaConfig::kScale) with dilation `dilation`.
  SERes2BlockImpl(int64_t channels, int64_t dilation);
  /// `x`: [B, C, T]; `lengths`: int64 [B], real steps (undefined: all). Returns [B, C, T].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& lengths = {});
  /// Parameters of a block of `channels` channels.
  static double parameters(double channels);

 private:
  int64_t width_;
  torch::nn::Conv1d conv1_{nullptr}, conv3_{nullptr};
  SyncBatchNorm1d bn1_{nullptr}, bn3_{nullptr};
  torch::nn::ModuleList convs_{nullptr}, bns_{nullptr};
  SqueezeExcite se_{nullptr};
};
TORCH_MODULE(SERes2Block);

/// The network: input normalisation; conv1 (5 taps, padding 2, M -> C) ReLU bn1; x1 = layer1(h), x2 = layer2(h +
/// x1), x3 = layer3(h + x1 + x2) (SERes2Block, dilations 2, 3, 4); layer4 (1x1, 3 C -> 3 C) over [x1; x2; x3], ReLU;
/// `pool` (AttentiveStatsPool with global context, over the real steps) -> [B, 6 C]; pool_bn (batch norm), `fc`
/// (linear 6 C -> E),
/// embedding_bn (batch norm): the embedding; then `aam`.
class EcapaImpl : public SpeakerModel {
 public:
  /// Builds the layers for `config` (validated first; throws InvalidArgument). Parameters are initialised by
  /// LibTorch's defaults (the AAM head: Xavier normal) from the global generator.
  explicit EcapaImpl(const EcapaConfig& config);
  /// `x`: [B, n_mels, T] or [B, 1, n_mels, T], float, T >= 1; `lengths` as Classifier::forward. Throws
  /// InvalidArgument for another shape or bad lengths.
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override;
  /// "ecapa".
  std::string kind() const override { return "ecapa"; }
  /// {"model": "ecapa", "n_mels", "n_frames", "num_classes", "channels", "embedding_dim"}.
  nlohmann::json architecture_json() const override;
  /// The configuration the model was built with.
  const EcapaConfig& config() const { return config_; }

 private:
  EcapaConfig config_;
  torch::nn::Conv1d conv1_{nullptr}, layer4_{nullptr};
  SyncBatchNorm1d bn1_{nullptr}, pool_bn_{nullptr}, embedding_bn_{nullptr};
  std::array<SERes2Block, 3> layers_{nullptr, nullptr, nullptr};
  AttentiveStatsPool pool_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Ecapa);

}  // namespace melforge::trainer
