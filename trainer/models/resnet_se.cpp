#include "models/resnet_se.h"

#include <cmath>
#include <limits>
#include <string>

#include "melforge/common/errors.h"
#include "models/time_mask.h"

namespace melforge::trainer {

namespace {

int64_t ceil_half(int64_t n) { return (n + 1) / 2; }

}  // namespace

ResNetSEConfig ResNetSEConfig::from_info(const MelInfo& info, int64_t num_classes) {
  ResNetSEConfig c;
  c.n_mels = info.n_mels;
  c.n_frames = info.n_frames;
  c.num_classes = num_classes;
  return c;
}

void ResNetSEConfig::validate() const {
  if (n_mels < 8 || n_frames < 8)
    throw InvalidArgument("--model resnet-se needs spectrograms of at least 8 x 8 (three stride-2 stages); the "
                          "dataset has " + std::to_string(n_mels) + " mel bands x " + std::to_string(n_frames) +
                          " frames");
  if (num_classes < 2)
    throw InvalidArgument("--model resnet-se needs at least 2 classes (speakers), the dataset has " +
                          std::to_string(num_classes));
  if (width != "half" && width != "quarter")
    throw InvalidArgument("--width must be half or quarter, got '" + width + "'");
  if (embedding_dim < 1) throw InvalidArgument("--embedding-dim must be >= 1, got " + std::to_string(embedding_dim));
}

ResNetSEConfig ResNetSEConfig::from_json(const nlohmann::json& j) {
  try {
    ResNetSEConfig c;
    c.n_mels = j.at("n_mels").get<int64_t>();
    c.n_frames = j.at("n_frames").get<int64_t>();
    c.num_classes = j.at("num_classes").get<int64_t>();
    c.width = j.at("width").get<std::string>();
    c.embedding_dim = j.at("embedding_dim").get<int64_t>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("resnet-se model configuration: ") + e.what());
  }
}

std::array<int64_t, 4> ResNetSEConfig::filters() const {
  if (width == "quarter") return {16, 32, 64, 128};
  return {32, 64, 128, 256};
}

int64_t ResNetSEConfig::out_mels() const { return ceil_half(ceil_half(ceil_half(n_mels))); }

int64_t ResNetSEConfig::out_frames() const { return ceil_half(ceil_half(ceil_half(n_frames))); }

ModelSize ResNetSEConfig::size() const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const auto f = filters();
  ModelSize s;
  s.parameters = conv_parameters(1, d(f[0]), 9) + batch_norm_parameters(d(f[0]));
  s.activation_floats = d(n_mels) * d(n_frames) * (1 + 2 * d(f[0]));
  int64_t in = f[0], h = n_mels, w = n_frames;
  for (std::size_t stage = 0; stage < 4; ++stage) {
    if (stage > 0) h = ceil_half(h), w = ceil_half(w);
    const double p = d(f[stage]), area = d(h) * d(w);
    for (int64_t b = 0; b < kBlocks[stage]; ++b) {
      const bool down = b == 0 && (stage > 0 || in != f[stage]);
      s.parameters += SEBasicBlockImpl::parameters(d(in), p, down);
      s.activation_floats += p * area * (down ? 8 : 6) + 3 * p + p / kReduction;
      in = f[stage];
    }
  }
  const ModelSize pool = AttentiveStatsPoolImpl::size(d(pool_features()), kAttention, false, d(out_frames()));
  s.parameters += pool.parameters + linear_parameters(2 * d(pool_features()), d(embedding_dim)) +
                  d(num_classes) * d(embedding_dim);
  s.activation_floats += pool.activation_floats + 2 * d(embedding_dim) + d(num_classes);
  return s;
}

SEBasicBlockImpl::SEBasicBlockImpl(int64_t in, int64_t planes, int64_t stride) : stride_(stride) {
  namespace nn = torch::nn;
  conv1_ = register_module("conv1",
                           nn::Conv2d(nn::Conv2dOptions(in, planes, 3).stride(stride).padding(1).bias(false)));
  bn1_ = register_module("bn1", SyncBatchNorm2d(planes));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(planes, planes, 3).padding(1).bias(false)));
  bn2_ = register_module("bn2", SyncBatchNorm2d(planes));
  se_ = register_module("se", SqueezeExcite(planes, planes / ResNetSEConfig::kReduction));
  if (stride != 1 || in != planes)
    downsample_ = register_module(
        "downsample", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, planes, 1).stride(stride).bias(false)),
                                     SyncBatchNorm2d(planes)));
}

at::Tensor SEBasicBlockImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  at::Tensor out = bn1_(conv1_(mask_time(x, lengths)).relu_());
  const at::Tensor out_lengths = output_lengths(lengths, x.size(-1));
  out = se_(bn2_(conv2_(mask_time(out, out_lengths))), out_lengths);
  return (out + (downsample_ ? downsample_->forward(x) : x)).relu_();
}

at::Tensor SEBasicBlockImpl::output_lengths(const at::Tensor& lengths, int64_t frames) const {
  return downsampled_lengths(lengths, stride_, (frames + stride_ - 1) / stride_);
}

double SEBasicBlockImpl::parameters(double in, double planes, bool downsample) {
  return conv_parameters(in, planes, 9, false) + conv_parameters(planes, planes, 9, false) +
         2 * batch_norm_parameters(planes) +
         SqueezeExciteImpl::parameters(planes, std::floor(planes / ResNetSEConfig::kReduction)) +
         (downsample ? conv_parameters(in, planes, 1, false) + batch_norm_parameters(planes) : 0);
}

ResNetSEImpl::ResNetSEImpl(const ResNetSEConfig& config)
    : SpeakerModel("resnet-se", config.embedding_dim, config.num_classes), config_(config) {
  config_.validate();
  namespace nn = torch::nn;
  const auto f = config_.filters();
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, f[0], 3).padding(1)));
  bn1_ = register_module("bn1", SyncBatchNorm2d(f[0]));
  int64_t in = f[0];
  for (std::size_t stage = 0; stage < 4; ++stage) {
    nn::ModuleList blocks;
    for (int64_t b = 0; b < ResNetSEConfig::kBlocks[stage]; ++b) {
      blocks->push_back(SEBasicBlock(in, f[stage], b == 0 && stage > 0 ? 2 : 1));
      in = f[stage];
    }
    layers_[stage] = register_module("layer" + std::to_string(stage + 1), blocks);
  }
  pool_ = register_module("pool", AttentiveStatsPool(config_.pool_features(), ResNetSEConfig::kAttention, false,
                                                     ResNetSEConfig::kEps));
  fc_ = register_module("fc", nn::Linear(2 * config_.pool_features(), config_.embedding_dim));
}

nlohmann::json ResNetSEImpl::architecture_json() const {
  return {{"model", "resnet-se"},
          {"n_mels", config_.n_mels},
          {"n_frames", config_.n_frames},
          {"num_classes", config_.num_classes},
          {"width", config_.width},
          {"embedding_dim", config_.embedding_dim}};
}

ModelOutput ResNetSEImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  const at::Tensor in = spectrogram_input(x, config_.n_mels, 1, std::numeric_limits<int64_t>::max(), "resnet-se");
  at::Tensor len = check_lengths(lengths, in.size(0), in.size(-1), in.device(), "resnet-se");
  at::Tensor h = bn1_(conv1_(mask_time(normalize_input(in, len), len)).relu_());
  for (auto& layer : layers_)
    for (const auto& block : *layer) {
      auto* b = block->as<SEBasicBlockImpl>();
      const int64_t frames = h.size(-1);
      h = b->forward(h, len);
      len = b->output_lengths(len, frames);
    }
  h = h.reshape({h.size(0), -1, h.size(-1)});
  return speaker_output(fc_(pool_(h, len)));
}

}  // namespace melforge::trainer
