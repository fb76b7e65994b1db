#include "models/cnn.h"

#include <string>

#include "melforge/common/errors.h"

namespace melforge::trainer {

CnnConfig CnnConfig::from_info(const MelInfo& info, int64_t num_classes) {
  CnnConfig c;
  c.n_mels = info.n_mels;
  c.n_frames = info.n_frames;
  c.num_classes = num_classes;
  return c;
}

void CnnConfig::validate() const {
  if (n_mels < 4 || n_frames < 4)
    throw InvalidArgument("--model cnn needs spectrograms of at least 4 x 4 (two 2x2 max-pools); the dataset has " +
                          std::to_string(n_mels) + " mel bands x " + std::to_string(n_frames) + " frames");
  if (num_classes < 2)
    throw InvalidArgument("--model cnn needs at least 2 classes, the dataset has " + std::to_string(num_classes));
  for (const int64_t c : channels)
    if (c < 1) throw InvalidArgument("--model cnn: every convolution needs at least 1 channel");
  if (hidden < 1) throw InvalidArgument("--hidden must be >= 1, got " + std::to_string(hidden));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw InvalidArgument("--dropout must be in [0, 1), got " + std::to_string(dropout));
}

CnnConfig CnnConfig::from_json(const nlohmann::json& j) {
  try {
    CnnConfig c;
    c.n_mels = j.at("n_mels").get<int64_t>();
    c.n_frames = j.at("n_frames").get<int64_t>();
    c.num_classes = j.at("num_classes").get<int64_t>();
    c.channels = j.at("channels").get<std::array<int64_t, 3>>();
    c.hidden = j.at("hidden").get<int64_t>();
    c.dropout = j.at("dropout").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("cnn model configuration: ") + e.what());
  }
}

int64_t CnnConfig::flat_features() const { return channels[2] * (n_mels / 2 / 2) * (n_frames / 2 / 2); }

ModelSize CnnConfig::size() const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const double m = d(n_mels), t = d(n_frames), m4 = d(n_mels / 4), t4 = d(n_frames / 4);
  const double m2t2 = d(n_mels / 2) * d(n_frames / 2), c0 = d(channels[0]), c1 = d(channels[1]), c2 = d(channels[2]);
  ModelSize s;
  s.parameters = conv3x3_parameters(1, c0) + conv3x3_parameters(c0, c1) + conv3x3_parameters(c1, c2) +
                 linear_parameters(d(flat_features()), d(hidden)) + linear_parameters(d(hidden), d(num_classes)) +
                 linear_parameters(d(hidden), 1);
  s.activation_floats = m * t * (1 + c0) + m2t2 * (c0 + c1) + m4 * t4 * (c1 + c2) + 2 * d(hidden) +
                        d(num_classes) + 1;
  return s;
}

CnnNetImpl::CnnNetImpl(const CnnConfig& config) : config_(config) {
  config_.validate();
  namespace nn = torch::nn;
  const auto& ch = config_.channels;
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, ch[0], 3).padding(1)));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch[0], ch[1], 3).padding(1)));
  conv3_ = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(ch[1], ch[2], 3).padding(1)));
  pool_ = register_module("pool", nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  relu_ = register_module("relu", nn::ReLU(nn::ReLUOptions().inplace(true)));
  fc_ = register_module("fc", nn::Linear(config_.flat_features(), config_.hidden));
  dropout_ = register_module("dropout", nn::Dropout(nn::DropoutOptions(config_.dropout)));
  class_head_ = register_module("class_head", nn::Linear(config_.hidden, config_.num_classes));
  detect_head_ = register_module("detect_head", nn::Linear(config_.hidden, 1));
}

nlohmann::json CnnNetImpl::config_json() const {
  return {{"model", "cnn"},          {"n_mels", config_.n_mels}, {"n_frames", config_.n_frames},
          {"num_classes", config_.num_classes}, {"channels", config_.channels},
          {"hidden", config_.hidden},        {"dropout", config_.dropout}};
}

ModelOutput CnnNetImpl::forward(const at::Tensor& x) {
  at::Tensor h = normalize_input(spectrogram_input(x, config_.n_mels, config_.n_frames, "cnn"));
  h = pool_(relu_(conv1_(h)));
  h = pool_(relu_(conv2_(h)));
  h = relu_(conv3_(h));
  h = dropout_(relu_(fc_(h.flatten(1))));
  return {class_head_(h), detect_head_(h).squeeze(1), {}};
}

}  // namespace melforge::trainer
