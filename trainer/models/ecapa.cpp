#include "models/ecapa.h"

#include <ATen/ops/cat.h>

#include <limits>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "models/time_mask.h"

namespace melforge::trainer {

EcapaConfig EcapaConfig::from_info(const MelInfo& info, int64_t num_classes) {
  EcapaConfig c;
  c.n_mels = info.n_mels;
  c.n_frames = info.n_frames;
  c.num_classes = num_classes;
  return c;
}

void EcapaConfig::validate() const {
  if (n_mels < 1 || n_frames < 2)
    throw InvalidArgument("--model ecapa needs spectrograms of at least 1 mel band x 2 frames; the dataset has " +
                          std::to_string(n_mels) + " mel bands x " + std::to_string(n_frames) + " frames");
  if (num_classes < 2)
    throw InvalidArgument("--model ecapa needs at least 2 classes (speakers), the dataset has " +
                          std::to_string(num_classes));
  if (channels < kScale || channels % kScale != 0)
    throw InvalidArgument("--channels must be a positive multiple of " + std::to_string(kScale) + ", got " +
                          std::to_string(channels));
  if (embedding_dim < 1) throw InvalidArgument("--embedding-dim must be >= 1, got " + std::to_string(embedding_dim));
}

EcapaConfig EcapaConfig::from_json(const nlohmann::json& j) {
  try {
    EcapaConfig c;
    c.n_mels = j.at("n_mels").get<int64_t>();
    c.n_frames = j.at("n_frames").get<int64_t>();
    c.num_classes = j.at("num_classes").get<int64_t>();
    c.channels = j.at("channels").get<int64_t>();
    c.embedding_dim = j.at("embedding_dim").get<int64_t>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("ecapa model configuration: ") + e.what());
  }
}

ModelSize EcapaConfig::size() const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const double c = d(channels), t = d(n_frames), e = d(embedding_dim);
  ModelSize s;
  s.parameters = conv_parameters(d(n_mels), c, 5) + batch_norm_parameters(c) + 3 * SERes2BlockImpl::parameters(c) +
                 conv_parameters(3 * c, 3 * c, 1) + batch_norm_parameters(6 * c) + linear_parameters(6 * c, e) +
                 batch_norm_parameters(e) + d(num_classes) * e;
  const double block = c * t * (2 + 2 * (kScale - 1) + 1 + 2 + 1 + 1) + 2 * c + kSeBottleneck;
  s.activation_floats = d(n_mels) * t + 2 * c * t + 3 * block + 2 * c * t + 3 * c * t * 2;
  const ModelSize pool = AttentiveStatsPoolImpl::size(3 * c, kAttention, true, t);
  s.parameters += pool.parameters;
  s.activation_floats += pool.activation_floats + 12 * c + 3 * e + d(num_classes);
  return s;
}

SERes2BlockImpl::SERes2BlockImpl(int64_t channels, int64_t dilation) : width_(channels / EcapaConfig::kScale) {
  namespace nn = torch::nn;
  conv1_ = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(channels, channels, 1)));
  bn1_ = register_module("bn1", SyncBatchNorm1d(channels));
  convs_ = register_module("convs", nn::ModuleList());
  bns_ = register_module("bns", nn::ModuleList());
  for (int64_t i = 0; i + 1 < EcapaConfig::kScale; ++i) {
    convs_->push_back(nn::Conv1d(nn::Conv1dOptions(width_, width_, 3).dilation(dilation).padding(dilation)));
    bns_->push_back(SyncBatchNorm1d(width_));
  }
  conv3_ = register_module("conv3", nn::Conv1d(nn::Conv1dOptions(channels, channels, 1)));
  bn3_ = register_module("bn3", SyncBatchNorm1d(channels));
  se_ = register_module("se", SqueezeExcite(channels, EcapaConfig::kSeBottleneck));
}

at::Tensor SERes2BlockImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  const at::Tensor out = bn1_(conv1_(x).relu_());
  const std::vector<at::Tensor> groups = out.split(width_, 1);
  std::vector<at::Tensor> parts;
  at::Tensor y;
  for (std::size_t i = 0; i + 1 < groups.size(); ++i) {
    y = i == 0 ? groups[0] : y + groups[i];
    y = bns_[i]->as<SyncBatchNorm1dImpl>()->forward(
        convs_[i]->as<torch::nn::Conv1dImpl>()->forward(mask_time(y, lengths)).relu_());
    parts.push_back(y);
  }
  parts.push_back(groups.back());
  return se_(bn3_(conv3_(at::cat(parts, 1)).relu_()), lengths) + x;
}

double SERes2BlockImpl::parameters(double channels) {
  const double w = channels / EcapaConfig::kScale, n = EcapaConfig::kScale - 1;
  return 2 * (conv_parameters(channels, channels, 1) + batch_norm_parameters(channels)) +
         n * (conv_parameters(w, w, 3) + batch_norm_parameters(w)) +
         SqueezeExciteImpl::parameters(channels, EcapaConfig::kSeBottleneck);
}

EcapaImpl::EcapaImpl(const EcapaConfig& config)
    : SpeakerModel("ecapa", config.embedding_dim, config.num_classes), config_(config) {
  config_.validate();
  namespace nn = torch::nn;
  const int64_t c = config_.channels;
  conv1_ = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(config_.n_mels, c, 5).padding(2)));
  bn1_ = register_module("bn1", SyncBatchNorm1d(c));
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i] = register_module("layer" + std::to_string(i + 1), SERes2Block(c, EcapaConfig::kDilations[i]));
  layer4_ = register_module("layer4", nn::Conv1d(nn::Conv1dOptions(3 * c, 3 * c, 1)));
  pool_ = register_module("pool", AttentiveStatsPool(3 * c, EcapaConfig::kAttention, true, EcapaConfig::kEps));
  pool_bn_ = register_module("pool_bn", SyncBatchNorm1d(6 * c));
  fc_ = register_module("fc", nn::Linear(6 * c, config_.embedding_dim));
  embedding_bn_ = register_module("embedding_bn", SyncBatchNorm1d(config_.embedding_dim));
}

nlohmann::json EcapaImpl::architecture_json() const {
  return {{"model", "ecapa"},
          {"n_mels", config_.n_mels},
          {"n_frames", config_.n_frames},
          {"num_classes", config_.num_classes},
          {"channels", config_.channels},
          {"embedding_dim", config_.embedding_dim}};
}

ModelOutput EcapaImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  const at::Tensor in =
      spectrogram_input(x, config_.n_mels, 1, std::numeric_limits<int64_t>::max(), "ecapa").squeeze(1);
  const at::Tensor len = check_lengths(lengths, in.size(0), in.size(-1), in.device(), "ecapa");
  const at::Tensor h = bn1_(conv1_(mask_time(normalize_input(in, len), len)).relu_());
  const at::Tensor x1 = layers_[0](h, len);
  const at::Tensor x2 = layers_[1](h + x1, len);
  const at::Tensor x3 = layers_[2](h + x1 + x2, len);
  const at::Tensor pooled = pool_(layer4_(at::cat({x1, x2, x3}, 1)).relu_(), len);
  return speaker_output(embedding_bn_(fc_(pool_bn_(pooled))));
}

}  // namespace melforge::trainer
