#pragma once
/// `train --sync-bn`: BatchNorm whose training statistics are those of the global batch of a data-parallel job, as
/// PyTorch's torch.nn.SyncBatchNorm (LibTorch's C++ API has none). The models build their batch norms as
/// SyncBatchNorm1d / SyncBatchNorm2d: LibTorch's BatchNorm1d / BatchNorm2d (same options, parameters weight and bias,
/// buffers running_mean, running_var and num_batches_tracked, so state dicts, checkpoints, exports and the Python
/// twins are unchanged) that, once install_sync_batch_norm() has given them a process group, normalise in training
/// mode with the statistics of every rank's batch:
///  - forward: per channel, the sum, the sum of squares and the count of this rank's values are packed into one
///    float64 [2 C + 1] tensor and summed over the ranks with one all-reduce; the output is normalised with the global
///    mean and biased variance; running_mean / running_var move towards the global mean and unbiased variance
///    (n / (n - 1), n the global count) by the momentum, as SyncBatchNorm;
///  - backward (an autograd Function, as torch/nn/modules/_functions.py's SyncBatchNorm): sum(dy) and sum(dy * xhat)
///    per channel are all-reduced (one [2 C] all-reduce) so that the input gradient is the single-process gradient
///    of the global batch; the weight and bias gradients stay this rank's own (the gradient all-reduce averages
///    them, as DDP does).
/// In eval mode, or without a process group, they are LibTorch's BatchNorm (running statistics in eval mode).
/// Every rank must run the same training-mode forwards and backwards (the collectives are matched by order).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>

#include <cstdint>

namespace melforge::trainer {

class ProcessGroup;

/// The process group a batch-norm layer synchronises through (null: none, the layer is a plain BatchNorm).
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  /// `group` (not owned; it must outlive every forward and backward through the layer), or nullptr to stop.
  void set_process_group(ProcessGroup* group) { group_ = group; }
  /// The group installed, or nullptr.
  ProcessGroup* process_group() const { return group_; }

 protected:
  /// The group installed, or nullptr.
  ProcessGroup* group_ = nullptr;
};

/// The training-mode forward of a synchronised batch norm over `x` [B, C, ...] (C = options.num_features(), any
/// trailing axes; float32/float64, or float16/bfloat16 computed in float32 and returned in x's type): the statistics
/// of the global batch through `group` (one all-reduce), the output [B, C, ...] with an autograd backward that
/// all-reduces once more. `weight`, `bias` [C] (undefined without options.affine()); `running_mean`, `running_var`
/// [C] and `num_batches_tracked` (scalar int64) are updated in place when options.track_running_stats(). A global
/// count of values per channel <= 1 gives NaN running variances, as PyTorch's does.
at::Tensor sync_batch_norm(const at::Tensor& x, const torch::nn::BatchNormOptions& options, const at::Tensor& weight,
                           const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var,
                           at::Tensor num_batches_tracked, ProcessGroup& group);

/// LibTorch's BatchNorm1dImpl or BatchNorm2dImpl (`Base`) that synchronises its training statistics through the
/// process group installed (BatchNormSync), else behaves as Base.
template <typename Base>
class SyncableBatchNormImpl : public Base, public BatchNormSync {
 public:
  /// A batch norm over `num_features` channels (LibTorch's defaults: eps 1e-5, momentum 0.1, affine, running stats).
  explicit SyncableBatchNormImpl(int64_t num_features) : Base(num_features) {}
  /// A batch norm with `options`.
  explicit SyncableBatchNormImpl(const torch::nn::BatchNormOptions& options) : Base(options) {}

  /// `x`: [B, C] or [B, C, T] (1d), [B, C, H, W] (2d). Training mode with a group: sync_batch_norm; else Base's.
  at::Tensor forward(const at::Tensor& x) {
    if (group_ == nullptr || !this->is_training()) return Base::forward(x);
    this->_check_input_dim(x);
    return sync_batch_norm(x, this->options, this->weight, this->bias, this->running_mean, this->running_var,
                           this->num_batches_tracked, *group_);
  }
};

/// BatchNorm1d of the models: [B, C] or [B, C, T].
using SyncBatchNorm1dImpl = SyncableBatchNormImpl<torch::nn::BatchNorm1dImpl>;
TORCH_MODULE(SyncBatchNorm1d);
/// BatchNorm2d of the models: [B, C, H, W].
using SyncBatchNorm2dImpl = SyncableBatchNormImpl<torch::nn::BatchNorm2dImpl>;
TORCH_MODULE(SyncBatchNorm2d);

/// Gives every batch norm of `model` (itself included) `group` (nullptr: takes it away). Returns the number of
/// layers. Throws Error when `model` holds a LibTorch batch norm that cannot synchronise (a model built with
/// torch::nn::BatchNorm*d instead of SyncBatchNorm*d), so that no layer is left per-rank silently.
int64_t install_sync_batch_norm(torch::nn::Module& model, ProcessGroup* group);

}  // namespace melforge::trainer
