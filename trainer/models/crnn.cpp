#include "models/crnn.h"

#include <ATen/ops/zeros.h>

#include <limits>
#include <string>
#include <tuple>

#include "melforge/common/errors.h"
#include "models/time_mask.h"

namespace melforge::trainer {

CrnnConfig CrnnConfig::from_info(const MelInfo& info, int64_t num_classes) {
  CrnnConfig c;
  c.n_mels = info.n_mels;
  c.n_frames = info.n_frames;
  c.num_classes = num_classes;
  return c;
}

void CrnnConfig::validate() const {
  if (n_mels < 4 || n_frames < 2)
    throw InvalidArgument("--model crnn needs spectrograms of at least 4 mel bands x 2 frames; the dataset has " +
                          std::to_string(n_mels) + " mel bands x " + std::to_string(n_frames) + " frames");
  if (num_classes < 2)
    throw InvalidArgument("--model crnn needs at least 2 classes, the dataset has " + std::to_string(num_classes));
  for (const int64_t c : channels)
    if (c < 1) throw InvalidArgument("--model crnn: every convolution needs at least 1 channel");
  if (rnn != "gru" && rnn != "lstm") throw InvalidArgument("--rnn: unknown layer '" + rnn + "' (gru or lstm)");
  if (rnn_hidden < 1) throw InvalidArgument("--rnn-hidden must be >= 1, got " + std::to_string(rnn_hidden));
  if (hidden < 1) throw InvalidArgument("--hidden must be >= 1, got " + std::to_string(hidden));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw InvalidArgument("--dropout must be in [0, 1), got " + std::to_string(dropout));
}

CrnnConfig CrnnConfig::from_json(const nlohmann::json& j) {
  try {
    CrnnConfig c;
    c.n_mels = j.at("n_mels").get<int64_t>();
    c.n_frames = j.at("n_frames").get<int64_t>();
    c.num_classes = j.at("num_classes").get<int64_t>();
    if (!j.at("channels").is_array() || j.at("channels").size() != 2)
      throw FormatError("crnn model configuration: 'channels' must hold 2 channel counts");
    c.channels = j.at("channels").get<std::array<int64_t, 2>>();
    c.rnn = j.at("rnn").get<std::string>();
    c.rnn_hidden = j.at("rnn_hidden").get<int64_t>();
    c.hidden = j.at("hidden").get<int64_t>();
    c.dropout = j.at("dropout").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("crnn model configuration: ") + e.what());
  }
}

ModelSize CrnnConfig::size() const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const double gates = rnn == "gru" ? 3 : 4, h = d(rnn_hidden), steps = d(rnn_steps()), c0 = d(channels[0]);
  const double c1 = d(channels[1]), m2t2 = d(n_mels / 2) * steps;
  ModelSize s;
  s.parameters = conv3x3_parameters(1, c0) + conv3x3_parameters(c0, c1) +
                 gates * (d(rnn_features()) * h + h * h + 2 * h) + linear_parameters(h, d(hidden)) +
                 linear_parameters(d(hidden), d(num_classes)) + linear_parameters(d(hidden), 1);
  s.activation_floats = d(n_mels) * 2 * steps * (1 + c0) + m2t2 * (c0 + c1) + d(rnn_features()) * steps +
                        (gates + 1) * h * steps + 2 * d(hidden) + d(num_classes) + 1;
  return s;
}

CrnnNetImpl::CrnnNetImpl(const CrnnConfig& config) : config_(config) {
  config_.validate();
  namespace nn = torch::nn;
  const auto& ch = config_.channels;
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, ch[0], 3).padding(1)));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch[0], ch[1], 3).padding(1)));
  pool_ = register_module("pool", nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  pool_mel_ = register_module("pool_mel", nn::MaxPool2d(nn::MaxPool2dOptions({2, 1})));
  relu_ = register_module("relu", nn::ReLU(nn::ReLUOptions().inplace(true)));
  if (config_.rnn == "gru")
    gru_ = register_module(
        "rnn", nn::GRU(nn::GRUOptions(config_.rnn_features(), config_.rnn_hidden).num_layers(1).batch_first(true)));
  else
    lstm_ = register_module(
        "rnn", nn::LSTM(nn::LSTMOptions(config_.rnn_features(), config_.rnn_hidden).num_layers(1).batch_first(true)));
  fc_ = register_module("fc", nn::Linear(config_.rnn_hidden, config_.hidden));
  dropout_ = register_module("dropout", nn::Dropout(nn::DropoutOptions(config_.dropout)));
  class_head_ = register_module("class_head", nn::Linear(config_.hidden, config_.num_classes));
  detect_head_ = register_module("detect_head", nn::Linear(config_.hidden, 1));
}

nlohmann::json CrnnNetImpl::architecture_json() const {
  return {{"model", "crnn"},
          {"n_mels", config_.n_mels},
          {"n_frames", config_.n_frames},
          {"num_classes", config_.num_classes},
          {"channels", config_.channels},
          {"rnn", config_.rnn},
          {"rnn_hidden", config_.rnn_hidden},
          {"hidden", config_.hidden},
          {"dropout", config_.dropout}};
}

ModelOutput CrnnNetImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  const at::Tensor in = spectrogram_input(x, config_.n_mels, 1, std::numeric_limits<int64_t>::max(), "crnn");
  at::Tensor len = check_lengths(lengths, in.size(0), in.size(-1), in.device(), "crnn");
  if (!len.defined() && in.size(-1) % 2 != 0) len = full_lengths(in.size(0), in.size(-1), in.device());
  at::Tensor h = mask_time(pad_time_to_multiple(normalize_input(in, len), 2), len);
  h = pool_(relu_(conv1_(h)));
  const at::Tensor steps = downsampled_lengths(len, 2, h.size(-1));
  h = pool_mel_(relu_(conv2_(mask_time(h, steps))));
  h = h.permute({0, 3, 1, 2}).flatten(2);
  const int64_t batch = h.size(0);
  if (!h0_.defined() || h0_.size(1) < batch || h0_.device() != h.device() || h0_.scalar_type() != h.scalar_type())
    h0_ = at::zeros({1, batch, config_.rnn_hidden}, h.options());
  const at::Tensor hx = h0_.narrow(1, 0, batch);
  h = gru_ ? std::get<0>(gru_->forward(h, hx)) : std::get<0>(lstm_->forward(h, std::make_tuple(hx, hx)));
  h = dropout_(relu_(fc_(masked_mean_time(h.transpose(1, 2), steps))));
  return {class_head_(h), detect_head_(h).squeeze(1), {}};
}

}  // namespace melforge::trainer
