#include "models/sync_batch_norm.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/zeros.h>
#include <torch/autograd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/dist.h"
#include "melforge/common/errors.h"

namespace melforge::trainer {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Every axis of a [B, C, ...] tensor of `dim` axes but the channels.
std::vector<int64_t> reduced_axes(int64_t dim) {
  std::vector<int64_t> axes{0};
  for (int64_t a = 2; a < dim; ++a) axes.push_back(a);
  return axes;
}

/// `v` [C] shaped to broadcast over a [B, C, ...] tensor of `dim` axes.
at::Tensor per_channel(const at::Tensor& v, int64_t dim) {
  std::vector<int64_t> shape(static_cast<std::size_t>(dim), 1);
  shape[1] = -1;
  return v.reshape(shape);
}

/// `x` in the type the statistics are computed in: float32 for the half-precision types, else its own.
at::Tensor compute_type(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16 ? x.to(at::kFloat) : x;
}

/// The ProcessGroup pointer kept in an autograd context (an IValue holds integers, not pointers).
int64_t pointer_value(ProcessGroup* group) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(group)); }

ProcessGroup& group_of(const AutogradContext& ctx) {
  return *reinterpret_cast<ProcessGroup*>(static_cast<intptr_t>(ctx.saved_data.at("group").toInt()));
}

/// y = (x - mean) * invstd * weight + bias with the global statistics; backward all-reduces sum(dy) and
/// sum(dy * xhat) (torch/nn/modules/_functions.py, SyncBatchNorm).
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  /// `mean`, `invstd` [C] (computation type, no gradient); `count`: float64 [1], the global values per channel.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            const at::Tensor& count, ProcessGroup* group) {
    const int64_t dim = x.dim();
    at::Tensor y = (compute_type(x) - per_channel(mean, dim)) * per_channel(invstd, dim);
    if (weight.defined()) y = y * per_channel(weight.to(y.scalar_type()), dim);
    if (bias.defined()) y = y + per_channel(bias.to(y.scalar_type()), dim);
    ctx->save_for_backward({x, weight, mean, invstd, count});
    ctx->saved_data["group"] = pointer_value(group);
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3], &count = saved[4];
    const int64_t dim = x.dim(), channels = mean.size(0);
    const std::vector<int64_t> axes = reduced_axes(dim);
    const at::Tensor dy = compute_type(grads[0]);
    const at::Tensor xhat = (compute_type(x) - per_channel(mean, dim)) * per_channel(invstd, dim);
    at::Tensor sum_dy = dy.sum(axes), sum_dy_xhat = (dy * xhat).sum(axes);
    at::Tensor grad_weight, grad_bias, grad_x;
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = sum_dy_xhat.to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      std::vector<at::Tensor> packed{at::cat({sum_dy, sum_dy_xhat})};
      group_of(*ctx).allreduce_sum(packed);
      const at::Tensor n = count.to(dy.scalar_type());
      const at::Tensor mean_dy = packed[0].narrow(0, 0, channels) / n;
      const at::Tensor mean_dy_xhat = packed[0].narrow(0, channels, channels) / n;
      at::Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(invstd.scalar_type());
      grad_x = ((dy - per_channel(mean_dy, dim) - xhat * per_channel(mean_dy_xhat, dim)) * per_channel(scale, dim))
                   .to(x.scalar_type());
    }
    return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// Per channel statistics of the global batch, float64: mean, biased variance, 1 / sqrt(variance + eps) [C], and
/// the count of values per channel [1].
struct GlobalStatistics {
  at::Tensor mean, var, invstd, count;
};

/// The statistics of `x` [B, C, ...] over every rank of `group` (one all-reduce of a float64 [2 C + 1] tensor). The
/// sums are this rank's count times its mean and times its variance + mean^2, the mean and variance computed by
/// var_mean (Welford) in x's computation type: sums of squares accumulated in float32 lose the variance to
/// cancellation when the mean is much larger than the standard deviation.

GlobalStatistics global_statistics(const at::Tensor& x, double eps, ProcessGroup& group) {
  const at::NoGradGuard no_grad;
  const at::Tensor xc = compute_type(x);
  const std::vector<int64_t> axes = reduced_axes(x.dim());
  const int64_t channels = x.size(1);
  const int64_t local = channels > 0 ? x.numel() / channels : 0;
  const auto f64 = xc.options().dtype(at::kDouble);
  at::Tensor sum = at::zeros({channels}, f64), sum_squares = at::zeros({channels}, f64);
  if (local > 0) {
    const auto [var, mean] = at::var_mean(xc, axes, std::optional<at::Scalar>(0), /*keepdim=*/false);
    const at::Tensor m = mean.to(at::kDouble);
    sum = m * static_cast<double>(local);
    sum_squares = (var.to(at::kDouble) + m * m) * static_cast<double>(local);
  }
  std::vector<at::Tensor> packed{at::cat({sum, sum_squares, at::full({1}, static_cast<double>(local), f64)})};
  group.allreduce_sum(packed);
  GlobalStatistics s;
  s.count = packed[0].narrow(0, 2 * channels, 1);
  s.mean = packed[0].narrow(0, 0, channels) / s.count;
  s.var = (packed[0].narrow(0, channels, channels) / s.count - s.mean * s.mean).clamp_min(0.0);
  s.invstd = at::rsqrt(s.var + eps);
  return s;
}

}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& x, const torch::nn::BatchNormOptions& options, const at::Tensor& weight,
                           const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var,
                           at::Tensor num_batches_tracked, ProcessGroup& group) {
  if (x.dim() < 2 || x.size(1) != options.num_features())
    throw InvalidArgument("sync batch norm: expected [B, " + std::to_string(options.num_features()) +
                          ", ...], got " + std::to_string(x.dim()) + " axes");
  const GlobalStatistics s = global_statistics(x, options.eps(), group);
  const at::ScalarType type = compute_type(x).scalar_type();
  if (options.track_running_stats() && running_mean.defined()) {
    const at::NoGradGuard no_grad;
    double momentum = options.momentum().value_or(0.0);
    if (num_batches_tracked.defined()) {
      num_batches_tracked.add_(1);
      if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();
    }
    const at::Tensor unbiased = s.var * s.count / (s.count - 1.0);
    running_mean.mul_(1.0 - momentum).add_(s.mean.to(running_mean.scalar_type()), momentum);
    running_var.mul_(1.0 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
  }
  return SyncBatchNormFunction::apply(x, weight, bias, s.mean.to(type), s.invstd.to(type), s.count, &group);
}

int64_t install_sync_batch_norm(torch::nn::Module& model, ProcessGroup* group) {
  int64_t layers = 0;
  std::vector<torch::nn::Module*> all{&model};
  for (const auto& m : model.modules(/*include_self=*/false)) all.push_back(m.get());
  for (torch::nn::Module* m : all) {
    if (auto* sync = dynamic_cast<BatchNormSync*>(m)) {
      sync->set_process_group(group);
      ++layers;
      continue;
    }
    if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(m) != nullptr ||
        dynamic_cast<torch::nn::BatchNorm2dImpl*>(m) != nullptr ||
        dynamic_cast<torch::nn::BatchNorm3dImpl*>(m) != nullptr)
      throw Error("--sync-bn: the model holds a batch norm (" + m->name() +
                  ") built without synchronisation (models/sync_batch_norm.h)");
  }
  return layers;
}

}  // namespace melforge::trainer
