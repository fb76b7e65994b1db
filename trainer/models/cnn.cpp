#include "models/cnn.h"

#include <ATen/ops/cat.h>

#include <limits>
#include <string>

#include "melforge/common/errors.h"
#include "models/time_mask.h"

namespace melforge::trainer {

CnnConfig CnnConfig::from_info(const MelInfo& info, int64_t num_classes) {
  CnnConfig c;
  c.n_mels = info.n_mels;
  c.n_frames = info.n_frames;
  c.num_classes = num_classes;
  return c;
}

void CnnConfig::validate() const {
  if (time_pool != "mean_max" && time_pool != "flatten")
    throw InvalidArgument("cnn model configuration: unknown time_pool '" + time_pool + "' (mean_max or flatten)");
  const int64_t min_frames = time_pool == "flatten" ? 4 : 1;
  if (n_mels < 4 || n_frames < min_frames)
    throw InvalidArgument("--model cnn needs spectrograms of at least 4 mel bands (two 2x2 max-pools) x " +
                          std::to_string(min_frames) + " frames; the dataset has " + std::to_string(n_mels) +
                          " mel bands x " + std::to_string(n_frames) + " frames");
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
    c.time_pool = j.contains("time_pool") ? j.at("time_pool").get<std::string>() : "flatten";
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("cnn model configuration: ") + e.what());
  }
}

int64_t CnnConfig::flat_features() const {
  if (time_pool == "flatten") return channels[2] * (n_mels / 2 / 2) * (n_frames / 2 / 2);
  return 2 * channels[2] * (n_mels / 2 / 2);
}

ModelSize CnnConfig::size() const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const bool flatten = time_pool == "flatten";
  const int64_t padded = flatten ? n_frames : (n_frames + 3) / 4 * 4;
  const double m = d(n_mels), t = d(padded), m4 = d(n_mels / 4), t4 = d(padded / 4);
  const double m2t2 = d(n_mels / 2) * d(padded / 2), c0 = d(channels[0]), c1 = d(channels[1]), c2 = d(channels[2]);
  ModelSize s;
  s.parameters = conv3x3_parameters(1, c0) + conv3x3_parameters(c0, c1) + conv3x3_parameters(c1, c2) +
                 linear_parameters(d(flat_features()), d(hidden)) + linear_parameters(d(hidden), d(num_classes)) +
                 linear_parameters(d(hidden), 1);
  s.activation_floats = m * t * (1 + c0) + m2t2 * (c0 + c1) + m4 * t4 * (c1 + c2) +
                        (flatten ? 0 : d(flat_features())) + 2 * d(hidden) + d(num_classes) + 1;
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

nlohmann::json CnnNetImpl::architecture_json() const {
  return {{"model", "cnn"},          {"n_mels", config_.n_mels}, {"n_frames", config_.n_frames},
          {"num_classes", config_.num_classes}, {"channels", config_.channels},
          {"hidden", config_.hidden},        {"dropout", config_.dropout},   {"time_pool", config_.time_pool}};
}

int64_t CnnNetImpl::fixed_frames() const { return config_.time_pool == "flatten" ? config_.n_frames : 0; }

at::Tensor CnnNetImpl::flatten_features(const at::Tensor& x, const at::Tensor& lengths) {
  if (lengths.defined() && lengths.lt(x.size(-1)).any().item<bool>())
    throw InvalidArgument("cnn: this model (time_pool flatten: a checkpoint from before inputs of any length) reads "
                          "every frame of its " + std::to_string(config_.n_frames) +
                          "-frame input and cannot leave padding out; give it full rows only");
  at::Tensor h = normalize_input(x, lengths);
  h = pool_(relu_(conv1_(h)));
  h = pool_(relu_(conv2_(h)));
  return relu_(conv3_(h)).flatten(1);
}

at::Tensor CnnNetImpl::mean_max_features(const at::Tensor& x, const at::Tensor& given) {
  const at::Tensor lengths =
      given.defined() || x.size(-1) % 4 == 0 ? given : full_lengths(x.size(0), x.size(-1), x.device());
  at::Tensor h = mask_time(pad_time_to_multiple(normalize_input(x, lengths), 4), lengths);
  h = pool_(relu_(conv1_(h)));
  const at::Tensor half = downsampled_lengths(lengths, 2, h.size(-1));
  h = pool_(relu_(conv2_(mask_time(h, half))));
  const at::Tensor quarter = downsampled_lengths(lengths, 4, h.size(-1));
  h = relu_(conv3_(mask_time(h, quarter)));
  return at::cat({masked_mean_time(h, quarter).flatten(1), masked_max_time(h, quarter).flatten(1)}, 1);
}

ModelOutput CnnNetImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  const int64_t fixed = fixed_frames();
  const at::Tensor in = spectrogram_input(x, config_.n_mels, fixed ? fixed : 1,
                                          fixed ? fixed : std::numeric_limits<int64_t>::max(), "cnn");
  const at::Tensor len = check_lengths(lengths, in.size(0), in.size(-1), in.device(), "cnn");
  const at::Tensor features = fixed ? flatten_features(in, len) : mean_max_features(in, len);
  const at::Tensor h = dropout_(relu_(fc_(features)));
  return {class_head_(h), detect_head_(h).squeeze(1), {}};
}

}  // namespace melforge::trainer
