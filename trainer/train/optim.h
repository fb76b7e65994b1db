#pragma once
/// The optimizer side of training: AdamW (ATen's fused kernel where the build has it for the parameters' device,
/// the multi-tensor `_foreach` path otherwise), a cosine learning-rate schedule with linear warmup, gradient
/// clipping by global norm, and an AMP GradScaler built from ATen's AMP ops. None of them syncs with the host.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// Optimizer, schedule, clipping and accumulation settings.
struct OptimOptions {
  /// Peak learning rate (after warmup).
  double lr = 1e-3;
  /// AdamW decoupled weight decay.
  double weight_decay = 1e-2;
  /// Adam beta1.
  double beta1 = 0.9;
  /// Adam beta2.
  double beta2 = 0.999;
  /// Adam epsilon.
  double eps = 1e-8;
  /// Linear warmup, as a fraction of all optimizer steps, in [0, 1).
  double warmup = 0.05;
  /// Learning rate at the end of the cosine, as a fraction of `lr`, in [0, 1].
  double min_lr_ratio = 0.0;
  /// Clip the global gradient L2 norm to this value; 0 disables clipping.
  double clip_norm = 1.0;
  /// Micro-batches whose gradients are summed (averaged) before one optimizer step; >= 1.
  int64_t accumulate = 1;
  /// `auto` (fused where available, else foreach), `fused` (error when unavailable) or `foreach`.
  std::string adamw_impl = "auto";

  /// Throws InvalidArgument naming the flag when a value is out of range.
  void validate() const;
};

/// Registers --lr --weight-decay --beta1 --beta2 --eps --warmup --min-lr-ratio --clip-norm --accumulate --adamw.
void add_options(boost::program_options::options_description& desc, OptimOptions& opts);

/// Whether ATen's fused AdamW kernel (at::_fused_adamw_) serves parameters of `device` and `dtype`: CPU or CUDA,
/// float32, float64, float16 or bfloat16.
bool fused_adamw_available(at::Device device, at::ScalarType dtype);

/// AdamW over a fixed list of parameters (PyTorch's torch.optim.AdamW semantics, amsgrad off).
///
/// Per parameter p with gradient g (divided by grad_scale when given) and step count t (after the increment):
/// p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
/// p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). State is created zero at construction; step
/// counts are float32 scalar tensors on the parameters' device, as torch keeps them for fused/capturable AdamW.
/// `found_inf` is 0 or 1 (as ATen's AMP ops write it); at 1 nothing changes, step counts included.
class AdamW {
 public:
  /// `params`: the model's parameters, all on one device. Throws InvalidArgument when `opts.adamw_impl` is `fused`
  /// and the fused kernel is unavailable for that device and dtype.
  AdamW(std::vector<at::Tensor> params, const OptimOptions& opts);
  /// One step at learning rate `lr`. Parameters without a gradient are skipped. With a GradScaler, pass its
  /// `grad_scale` and `found_inf` (float32 [1] on the parameters' device): gradients are unscaled inside the step
  /// and the step is a no-op when found_inf is non-zero, without a host sync.
  void step(double lr, const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {});
  /// The same with the learning rate as a float32 scalar tensor on the parameters' device (CUDA Graph capture).
  void step(const at::Tensor& lr, const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {});
  /// Sets every gradient to none.
  void zero_grad();
  /// "fused" or "foreach".
  std::string implementation() const;
  /// The state as tensors: "step.<i>", "exp_avg.<i>", "exp_avg_sq.<i>" for parameter i (CPU copies).
  std::map<std::string, at::Tensor> state_dict() const;
  /// Restores state_dict(); throws FormatError when a key is missing or a shape differs.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  OptimOptions opts_;
  bool fused_ = false;
};

/// Linear warmup from 0 to base_lr over `warmup_steps`, then a cosine from base_lr to base_lr * min_lr_ratio at
/// `total_steps`, constant after.
class CosineSchedule {
 public:
  /// Throws InvalidArgument when total_steps < 1 or warmup_steps > total_steps.
  CosineSchedule(double base_lr, int64_t total_steps, int64_t warmup_steps, double min_lr_ratio = 0.0);
  /// Learning rate of optimizer step `step` (0-based).
  double lr(int64_t step) const;
  /// {"base_lr", "total_steps", "warmup_steps", "min_lr_ratio"}.
  nlohmann::json to_json() const;

 private:
  double base_lr_, min_lr_ratio_;
  int64_t total_steps_, warmup_steps_;
};

/// Scales every gradient so that their global L2 norm is at most `max_norm` (torch.nn.utils.clip_grad_norm_:
/// g *= min(1, max_norm / (norm + 1e-6))). Parameters without a gradient are skipped; `max_norm` <= 0 only
/// measures. Returns the norm before clipping as a float32 scalar tensor on the parameters' device (no host sync;
/// 0 when no parameter has a gradient).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

/// Dynamic loss scaling for fp16 (torch.amp.GradScaler semantics, built from at::_amp_foreach_non_finite_check_
/// and_unscale_ and at::_amp_update_scale_). A disabled scaler is the identity and never skips a step.
class GradScaler {
 public:
  /// `device`: where the scale lives (the parameters' device).
  GradScaler(bool enabled, at::Device device, double init_scale = 65536.0, double growth_factor = 2.0,
             double backoff_factor = 0.5, int64_t growth_interval = 2000);
  /// Whether scaling is on.
  bool enabled() const { return enabled_; }
  /// loss * scale (loss unchanged when disabled).
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides every gradient by the scale in place and records found_inf (before clipping). No-op when disabled, and
  /// when unscale was already called since the last step.
  void unscale(const std::vector<at::Tensor>& params);
  /// Steps `opt` at `lr` unless the unscaled gradients held inf or NaN (no host sync), then updates the scale:
  /// back off on inf/NaN, grow after growth_interval clean steps. Calls unscale first if it was not called.
  void step(AdamW& opt, double lr, const std::vector<at::Tensor>& params);
  /// The current scale as a float32 [1] tensor (1 when disabled).
  const at::Tensor& scale_tensor() const { return scale_; }
  /// found_inf of the last unscale, float32 [1].
  const at::Tensor& found_inf() const { return found_inf_; }
  /// {"scale", "growth_tracker"} (CPU copies).
  std::map<std::string, at::Tensor> state_dict() const;
  /// Restores state_dict(); throws FormatError when a key is missing.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  bool enabled_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  at::Tensor scale_, growth_tracker_, found_inf_;
  bool unscaled_ = false;
};

}  // namespace melforge::trainer
