#pragma once
/// `--model crnn`: a convolutional front end over (mel, time), then a one-layer GRU or LSTM over the remaining time
/// steps, averaged over the real ones, a hidden fully connected layer and the two heads of `cnn` (multi-class logits
/// and one binary detection logit).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/modules/rnn.h>

#include <array>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "models/model.h"

namespace melforge::trainer {

/// Shape and widths of CrnnNet. The input shape comes from the dataset's attributes (CrnnConfig::from_info).
struct CrnnConfig {
  /// Mel bands of one input spectrogram (M); >= 4 (two max-pools halve the mel axis).
  int64_t n_mels = 64;
  /// Frames of the training examples (the tile width); >= 2. Inputs may have any T >= 1.
  int64_t n_frames = 32;
  /// Classes of the multi-class head (C); >= 2.
  int64_t num_classes = 2;
  /// Output channels of the two convolutions.
  std::array<int64_t, 2> channels = {16, 32};
  /// Recurrent layer: `gru` or `lstm`.
  std::string rnn = "gru";
  /// Hidden size of the recurrent layer (H).
  int64_t rnn_hidden = 64;
  /// Width of the hidden fully connected layer.
  int64_t hidden = 128;
  /// Dropout probability before the heads, in [0, 1).
  double dropout = 0.3;

  /// A config for spectrograms of `info` (n_mels, n_frames) and `num_classes` classes, default widths.
  static CrnnConfig from_info(const MelInfo& info, int64_t num_classes);
  /// Reads the fields config_json() writes; throws FormatError when one is missing or of the wrong type.
  static CrnnConfig from_json(const nlohmann::json& j);
  /// Throws InvalidArgument when a field is out of range.
  void validate() const;
  /// Time steps the recurrent layer sees for an n_frames input: ceil(n_frames / 2).
  int64_t rnn_steps() const { return (n_frames + 1) / 2; }
  /// Features of one time step: channels[1] * (n_mels / 4) (floor division after each pool).
  int64_t rnn_features() const { return channels[1] * (n_mels / 2 / 2); }
  /// The model's size before it is built (every weight and bias; activations of one input segment).
  ModelSize size() const;
};

/// The CRNN: the input normalisation of Classifier, the time axis padded to an even T, then conv3x3(1 -> c0) ReLU
/// maxpool 2x2, conv3x3(c0 -> c1) ReLU maxpool (2, 1) (mel only), so the map is [B, c1, M/4, T/2]; its T/2 columns,
/// flattened channel-major to c1 * M/4 features, are the input sequence of a batch-first one-layer GRU or LSTM
/// started from zeros; its outputs [B, T/2, H] are averaged over the real steps (ceil(lengths / 2); padding is zeros
/// before each convolution), then linear(H -> hidden) ReLU dropout and `class_head` (hidden -> C) and `detect_head`
/// (hidden -> 1). The recurrence runs forward only, so the steps after a row's real ones change none of the outputs
/// averaged (no packed sequence is needed). An input of odd T counts its last frame (ceil): a checkpoint of odd
/// n_frames from before inputs of any length dropped it (floor), and gives slightly different outputs now. Modules:
/// conv1, conv2, pool, pool_mel, relu (in place), rnn, fc, dropout, class_head, detect_head; buffers input_mean,
/// input_std (the names of python/melforge/models.py's Crnn). Parameters are initialised by LibTorch's defaults from the global generator.
class CrnnNetImpl : public Classifier {
 public:
  /// Builds the layers for `config` (validated first; throws InvalidArgument).
  explicit CrnnNetImpl(const CrnnConfig& config);
  /// `x`: [B, n_mels, T] or [B, 1, n_mels, T], float, T >= 1; `lengths` as Classifier::forward. Throws
  /// InvalidArgument for another shape or bad lengths.
  ModelOutput forward(const at::Tensor& x, const at::Tensor& lengths = {}) override;
  /// "crnn".
  std::string kind() const override { return "crnn"; }
  /// {"model": "crnn", "n_mels", "n_frames", "num_classes", "channels", "rnn", "rnn_hidden", "hidden", "dropout"}.
  nlohmann::json architecture_json() const override;
  /// The configuration the model was built with.
  const CrnnConfig& config() const { return config_; }
  /// The zero initial state, [1, B_max, H] for the largest batch B_max seen so far on the current device and dtype
  /// (undefined before the first forward). A forward pass uses its first B rows; it is reallocated only when a
  /// larger batch, another device or dtype comes. Not a parameter or buffer: it is not in the state dict.
  const at::Tensor& initial_state() const { return h0_; }

 private:
  CrnnConfig config_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::MaxPool2d pool_{nullptr}, pool_mel_{nullptr};
  torch::nn::ReLU relu_{nullptr};
  torch::nn::GRU gru_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear fc_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear class_head_{nullptr}, detect_head_{nullptr};
  at::Tensor h0_;
};
TORCH_MODULE(CrnnNet);

}  // namespace melforge::trainer
