#include "models/speaker.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/var.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>

#include <vector>

#include "melforge/common/errors.h"

namespace melforge::trainer {

SqueezeExciteImpl::SqueezeExciteImpl(int64_t channels, int64_t bottleneck) {
  fc1_ = register_module("fc1", torch::nn::Linear(channels, bottleneck));
  fc2_ = register_module("fc2", torch::nn::Linear(bottleneck, channels));
}

at::Tensor SqueezeExciteImpl::forward(const at::Tensor& x) {
  std::vector<int64_t> axes;
  for (int64_t a = 2; a < x.dim(); ++a) axes.push_back(a);
  at::Tensor s = x.mean(axes);
  s = at::sigmoid(fc2_(fc1_(s).relu_()));
  std::vector<int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  shape[1] = x.size(1);
  return x * s.view(shape);
}

double SqueezeExciteImpl::parameters(double channels, double bottleneck) {
  return linear_parameters(channels, bottleneck) + linear_parameters(bottleneck, channels);
}

AttentiveStatsPoolImpl::AttentiveStatsPoolImpl(int64_t channels, int64_t hidden, bool global_context, double eps)
    : global_context_(global_context), eps_(eps) {
  namespace nn = torch::nn;
  conv1_ = register_module("conv1", nn::Conv1d(nn::Conv1dOptions((global_context ? 3 : 1) * channels, hidden, 1)));
  bn_ = register_module("bn", nn::BatchNorm1d(hidden));
  conv2_ = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(hidden, channels, 1)));
}

at::Tensor AttentiveStatsPoolImpl::forward(const at::Tensor& x) {
  at::Tensor a = x;
  if (global_context_) {
    const at::Tensor mean = x.mean(2, true).expand_as(x);
    const at::Tensor std = at::sqrt(at::var(x, 2, /*unbiased=*/true, /*keepdim=*/true).clamp_min(eps_)).expand_as(x);
    a = at::cat({x, mean, std}, 1);
  }
  a = bn_(conv1_(a).relu_());
  if (global_context_) a = at::tanh(a);
  const at::Tensor w = at::softmax(conv2_(a), 2);
  const at::Tensor mu = (x * w).sum(2);
  const at::Tensor sigma = at::sqrt((((x * x) * w).sum(2) - mu * mu).clamp_min(eps_));
  return at::cat({mu, sigma}, 1);
}

ModelSize AttentiveStatsPoolImpl::size(double channels, double hidden, bool global_context, double steps) {
  const double in = (global_context ? 3 : 1) * channels;
  ModelSize s;
  s.parameters = conv_parameters(in, hidden, 1) + batch_norm_parameters(hidden) + conv_parameters(hidden, channels, 1);
  s.activation_floats = (global_context ? in * steps : 0) + hidden * steps * (global_context ? 3 : 2) +
                        channels * steps * 5 + 2 * channels * 3;
  return s;
}

SpeakerModel::SpeakerModel(const std::string& model, int64_t embedding_dim, int64_t num_classes)
    : embedding_dim_(embedding_dim) {
  if (num_classes < 2)
    throw InvalidArgument("--model " + model + " needs at least 2 classes (speakers), the dataset has " +
                          std::to_string(num_classes));
  if (embedding_dim < 1)
    throw InvalidArgument("--embedding-dim must be >= 1, got " + std::to_string(embedding_dim));
  aam_ = register_module("aam", torch::nn::Linear(torch::nn::LinearOptions(embedding_dim, num_classes).bias(false)));
  torch::nn::init::xavier_normal_(aam_->weight);
}

ModelOutput SpeakerModel::speaker_output(const at::Tensor& embedding) const {
  namespace F = torch::nn::functional;
  const auto unit = F::NormalizeFuncOptions().p(2).dim(1);
  ModelOutput out;
  out.logits = at::linear(F::normalize(embedding, unit), F::normalize(aam_->weight, unit));
  out.embedding = embedding;
  return out;
}

}  // namespace melforge::trainer
