#include "models/speaker.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/var.h>
#include <ATen/ops/where.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>

#include <limits>
#include <vector>

#include "melforge/common/errors.h"
#include "models/time_mask.h"

namespace melforge::trainer {

SqueezeExciteImpl::SqueezeExciteImpl(int64_t channels, int64_t bottleneck) {
  fc1_ = register_module("fc1", torch::nn::Linear(channels, bottleneck));
  fc2_ = register_module("fc2", torch::nn::Linear(bottleneck, channels));
}

at::Tensor SqueezeExciteImpl::forward(const at::Tensor& x, const at::Tensor& lengths) {
  std::vector<int64_t> axes;
  for (int64_t a = 2; a < x.dim(); ++a) axes.push_back(a);
  at::Tensor s = lengths.defined() ? masked_mean_time(x, lengths) : x.mean(axes);
  if (lengths.defined() && s.dim() > 2) s = s.flatten(2).mean(2);
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
  bn_ = register_module("bn", SyncBatchNorm1d(hidden));
  conv2_ = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(hidden, channels, 1)));
}

at::Tensor AttentiveStatsPoolImpl::forward(const at::Tensor& x, const at::Tensor& given) {
  const at::Tensor lengths = given.defined() || x.size(2) > 1 ? given : full_lengths(x.size(0), 1, x.device());
  if (!lengths.defined()) return pool(x, at::Tensor());
  const at::Tensor mask = time_mask(lengths, x.size(2)).unsqueeze(1);
  return pool(at::where(mask, x, 0), mask);
}

at::Tensor AttentiveStatsPoolImpl::pool(const at::Tensor& x, const at::Tensor& mask) {
  at::Tensor a = x;
  if (global_context_) {
    at::Tensor mean, var;
    if (mask.defined()) {
      const at::Tensor n = mask.sum(2, true).to(x.scalar_type());
      mean = x.sum(2, true) / n;
      var = at::where(mask, (x - mean).square(), 0).sum(2, true) / (n - 1).clamp_min(1);
    } else {
      mean = x.mean(2, true);
      var = at::var(x, 2, /*unbiased=*/true, /*keepdim=*/true);
    }
    a = at::cat({x, mean.expand_as(x), at::sqrt(var.clamp_min(eps_)).expand_as(x)}, 1);
  }
  a = bn_(conv1_(a).relu_());
  if (global_context_) a = at::tanh(a);
  at::Tensor logits = conv2_(a);
  if (mask.defined()) logits = logits.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor w = at::softmax(logits, 2);
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
