#pragma once
/// `--model cnn`: the small CNN of the Python trainer melforge-train replaces. One log-mel spectrogram [n_mels, T]
/// is one 1-channel image; three 3x3 convolutions with in-place ReLU, a 2x2 max-pool after the first two, a pooling
/// over time (CnnConfig::time_pool), a hidden fully connected layer, then two heads: multi-class logits and one
/// binary detection logit (the `--positive-class` head).
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <array>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "models/model.h"

namespace melforge::trainer {

/// Shape and width of CnnNet. The input shape comes from the dataset's attributes (CnnConfig::from_info).
struct CnnConfig {
  /// Mel bands of one input spectrogram (M); >= 4 so that two 2x2 pools leave at least one row.
  int64_t n_mels = 64;
  /// Frames of the training examples (the tile width); >= 1 (>= 4 for time_pool flatten, whose input width it is).
  int64_t n_frames = 32;
  /// Classes of the multi-class head (C); >= 2.
  int64_t num_classes = 2;
  /// Output channels of the three convolutions.
  std::array<int64_t, 3> channels = {16, 32, 64};
  /// Width of the hidden fully connected layer.
  int64_t hidden = 128;
  /// Dropout probability before the heads, in [0, 1).
  double dropout = 0.3;
  /// How the last feature map [channels[2], n_mels / 4, T'] becomes the fully connected layer's input:
  /// - `mean_max` (the default): its mean and its maximum over the real time steps (T' = ceil(T / 4) after the time
  ///   axis is padded to a multiple of 4), each flattened channel-major, concatenated: 2 * channels[2] * (n_mels / 4)
  ///   features, for inputs of any T and lengths. The maximum keeps an event that fills a few steps of a long clip
  ///   (the mean alone dilutes it by the clip's length); the mean keeps what lasts.
  /// - `flatten`: the whole map flattened (channels[2] * (n_mels / 4) * (n_frames / 4) features): the architecture of
  ///   checkpoints from before the field existed (from_json reads a missing field as this). Inputs must be exactly
  ///   n_frames wide and lengths full.
  std::string time_pool = "mean_max";

  /// A config for spectrograms of `info` (n_mels, n_frames) and `num_classes` classes, default widths.
  static CnnConfig from_info(const MelInfo& info, int64_t num_classes);
  /// Reads the fields config_json() writes; throws FormatError when one is missing or of the wrong type.
  static CnnConfig from_json(const nlohmann::json& j);
  /// Throws InvalidArgument when a field is out of range.
  void validate() const;
  /// Features of the fully connected layer's input: 2 * channels[2] * (n_mels / 4) for mean_max,
  /// channels[2] * (n_mels / 4) * (n_frames / 4) for flatten (floor division after each pool).
  int64_t flat_features() const;
  /// The model's size before it is built (every weight and bias; activations of one input segment).
  ModelSize size() const;
};

/// The CNN. Parameters are initialised by LibTorch's defaults from the global generator, so a model built after
/// torch::manual_seed(s) is the same for the same s.
class CnnNetImpl : public Classifier {
 public:
  /// Builds the layers for `config` (validated first; throws InvalidArgument).
  explicit CnnNetImpl(const CnnConfig& config);
  /// `x`: [B, n_mels, T] or [B, 1, n_mels, T], float, any T >= 1 (mean_max) or T = n_frames (flatten); `lengths`
  /// as Classifier::forward (flatten: every row full). Throws InvalidArgument for another shape or bad lengths.
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override;
  /// n_frames for time_pool flatten, else 0.
  int64_t fixed_frames() const override;
  /// "cnn".
  std::string kind() const override { return "cnn"; }
  /// {"model": "cnn", "n_mels", "n_frames", "num_classes", "channels", "hidden", "dropout", "time_pool"}.
  nlohmann::json architecture_json() const override;
  /// The configuration the model was built with.
  const CnnConfig& config() const { return config_; }

 private:
  /// The flatten architecture's feature vector [B, flat_features()] from the input [B, 1, n_mels, n_frames].
  at::Tensor flatten_features(const at::Tensor& x, const at::Tensor& lengths);
  /// The mean_max architecture's feature vector [B, flat_features()] from the input [B, 1, n_mels, T].
  at::Tensor mean_max_features(const at::Tensor& x, const at::Tensor& lengths);

  CnnConfig config_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::MaxPool2d pool_{nullptr};
  torch::nn::ReLU relu_{nullptr};
  torch::nn::Linear fc_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear class_head_{nullptr}, detect_head_{nullptr};
};
TORCH_MODULE(CnnNet);

}  // namespace melforge::trainer
