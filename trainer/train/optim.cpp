#include "train/optim.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_pow.h>
#include <ATen/ops/_foreach_reciprocal.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <numbers>
#include <optional>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/options.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const at::Tensor& state_entry(const std::map<std::string, at::Tensor>& state, const std::string& key,
                              const at::Tensor& like, const std::string& what) {
  const auto it = state.find(key);
  if (it == state.end() || !it->second.defined()) throw FormatError(what + " state: missing '" + key + "'");
  if (it->second.numel() != like.numel() || (like.dim() > 0 && it->second.sizes() != like.sizes()))
    throw FormatError(what + " state: '" + key + "' has shape " + shape_text(it->second.sizes()) + ", expected " +
                      shape_text(like.sizes()));
  return it->second;
}

}  // namespace

void OptimOptions::validate() const {
  if (!(std::isfinite(lr) && lr > 0.0)) throw InvalidArgument("--lr must be > 0, got " + num(lr));
  if (!finite_in(weight_decay, 0.0, INFINITY))
    throw InvalidArgument("--weight-decay must be >= 0, got " + num(weight_decay));
  if (!(finite_in(beta1, 0.0, 1.0) && beta1 < 1.0)) throw InvalidArgument("--beta1 must be in [0, 1), got " + num(beta1));
  if (!(finite_in(beta2, 0.0, 1.0) && beta2 < 1.0)) throw InvalidArgument("--beta2 must be in [0, 1), got " + num(beta2));
  if (!(std::isfinite(eps) && eps > 0.0)) throw InvalidArgument("--eps must be > 0, got " + num(eps));
  if (!(finite_in(warmup, 0.0, 1.0) && warmup < 1.0))
    throw InvalidArgument("--warmup must be in [0, 1), got " + num(warmup));
  if (!finite_in(min_lr_ratio, 0.0, 1.0))
    throw InvalidArgument("--min-lr-ratio must be in [0, 1], got " + num(min_lr_ratio));
  if (!finite_in(clip_norm, 0.0, INFINITY)) throw InvalidArgument("--clip-norm must be >= 0, got " + num(clip_norm));
  if (accumulate < 1) throw InvalidArgument("--accumulate must be >= 1, got " + std::to_string(accumulate));
  if (adamw_impl != "auto" && adamw_impl != "fused" && adamw_impl != "foreach")
    throw InvalidArgument("--adamw: unknown implementation '" + adamw_impl + "' (auto, fused or foreach)");
}

void add_options(po::options_description& desc, OptimOptions& opts) {
  desc.add_options()("lr", po::value(&opts.lr)->default_value(opts.lr, default_text(opts.lr))->value_name("LR"),
                     "peak learning rate (after warmup)")(
      "weight-decay", po::value(&opts.weight_decay)->default_value(opts.weight_decay, default_text(opts.weight_decay))->value_name("WD"),
      "AdamW decoupled weight decay")(
      "beta1", po::value(&opts.beta1)->default_value(opts.beta1, default_text(opts.beta1))->value_name("B1"), "Adam beta1, in [0, 1)")(
      "beta2", po::value(&opts.beta2)->default_value(opts.beta2, default_text(opts.beta2))->value_name("B2"), "Adam beta2, in [0, 1)")(
      "eps", po::value(&opts.eps)->default_value(opts.eps, default_text(opts.eps))->value_name("EPS"), "Adam epsilon")(
      "warmup", po::value(&opts.warmup)->default_value(opts.warmup, default_text(opts.warmup))->value_name("FRAC"),
      "linear warmup as a fraction of all optimizer steps, in [0, 1)")(
      "min-lr-ratio", po::value(&opts.min_lr_ratio)->default_value(opts.min_lr_ratio, default_text(opts.min_lr_ratio))->value_name("R"),
      "learning rate at the end of the cosine, as a fraction of --lr")(
      "clip-norm", po::value(&opts.clip_norm)->default_value(opts.clip_norm, default_text(opts.clip_norm))->value_name("N"),
      "clip the global gradient L2 norm to N; 0 disables")(
      "accumulate", po::value(&opts.accumulate)->default_value(opts.accumulate)->value_name("K"),
      "micro-batches per optimizer step (gradient accumulation)")(
      "adamw", po::value(&opts.adamw_impl)->default_value(opts.adamw_impl)->value_name("auto|fused|foreach"),
      "AdamW implementation: ATen's fused kernel, the multi-tensor foreach path, or auto (fused where available)");
}

bool fused_adamw_available(at::Device device, at::ScalarType dtype) {
  const bool dev = device.is_cpu() || device.is_cuda();
  const bool dt = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16;
  return dev && dt;
}

AdamW::AdamW(std::vector<at::Tensor> params, const OptimOptions& opts) : params_(std::move(params)), opts_(opts) {
  opts_.validate();
  bool fusable = true;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.defined()) throw InvalidArgument("AdamW: parameter " + std::to_string(i) + " is undefined");
    if (!p.is_floating_point()) throw InvalidArgument("AdamW: parameter " + std::to_string(i) + " is not floating");
    if (p.device() != params_[0].device())
      throw InvalidArgument("AdamW: parameters on several devices (" + params_[0].device().str() + ", " +
                            p.device().str() + ")");
    fusable = fusable && fused_adamw_available(p.device(), p.scalar_type());
  }
  if (opts_.adamw_impl == "fused" && !fusable)
    throw InvalidArgument("--adamw fused: ATen's fused AdamW does not serve these parameters (" +
                          (params_.empty() ? std::string("none") : params_[0].device().str()) + ")");
  fused_ = opts_.adamw_impl != "foreach" && fusable;
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params_) {
    exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

std::string AdamW::implementation() const { return fused_ ? "fused" : "foreach"; }

namespace {

struct ActiveState {
  std::vector<at::Tensor> p, g, m, v, s;
};

ActiveState with_grad(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& exp_avg,
                      const std::vector<at::Tensor>& exp_avg_sq, const std::vector<at::Tensor>& steps) {
  ActiveState a;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& grad = params[i].grad();
    if (!grad.defined()) continue;
    a.p.push_back(params[i]);
    a.g.push_back(grad);
    a.m.push_back(exp_avg[i]);
    a.v.push_back(exp_avg_sq[i]);
    a.s.push_back(steps[i]);
  }
  return a;
}

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace

void AdamW::step(double lr, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (!fused_) {
    if (!params_.empty()) step(at::scalar_tensor(lr, params_[0].options().dtype(at::kFloat)), grad_scale, found_inf);
    return;
  }
  ActiveState a = with_grad(params_, exp_avg_, exp_avg_sq_, steps_);
  if (a.p.empty()) return;
  at::NoGradGuard no_grad;
  at::_foreach_add_(a.s, 1);
  at::_fused_adamw_(a.p, a.g, a.m, a.v, {}, a.s, lr, opts_.beta1, opts_.beta2, opts_.weight_decay, opts_.eps, false,
                    false, optional_tensor(grad_scale), optional_tensor(found_inf));
  if (found_inf.defined()) at::_foreach_add_(a.s, found_inf.reshape({}), -1);
}

void AdamW::step(const at::Tensor& lr, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  ActiveState a = with_grad(params_, exp_avg_, exp_avg_sq_, steps_);
  if (a.p.empty()) return;
  at::NoGradGuard no_grad;
  if (fused_) {
    at::_foreach_add_(a.s, 1);
    at::_fused_adamw_(a.p, a.g, a.m, a.v, {}, a.s, lr, opts_.beta1, opts_.beta2, opts_.weight_decay, opts_.eps,
                      false, false, optional_tensor(grad_scale), optional_tensor(found_inf));
    if (found_inf.defined()) at::_foreach_add_(a.s, found_inf.reshape({}), -1);
    return;
  }
  auto& [p, g, m, v, s] = a;

  const at::Tensor lr0 = lr.reshape({}).to(at::kFloat);
  if (grad_scale.defined()) g = at::_foreach_div(g, grad_scale.reshape({}));
  at::Tensor keep;
  at::Tensor lr_eff = lr0;
  if (found_inf.defined()) {
    const at::Tensor skip = found_inf.reshape({}).ne(0);
    keep = skip.logical_not().to(at::kFloat);
    for (at::Tensor& grad : g) grad = at::where(skip, 0, grad);
    lr_eff = lr0 * keep;
  }
  const double b1 = opts_.beta1, b2 = opts_.beta2;

  if (keep.defined())
    at::_foreach_add_(s, keep);
  else
    at::_foreach_add_(s, 1);
  const std::vector<at::Tensor> t = keep.defined() ? at::_foreach_clamp_min(s, 1) : s;
  std::vector<at::Tensor> step_size = at::_foreach_pow(b1, t);
  at::_foreach_mul_(step_size, -1);
  at::_foreach_add_(step_size, 1);
  at::_foreach_reciprocal_(step_size);
  at::_foreach_mul_(step_size, lr_eff);
  std::vector<at::Tensor> bc2_sqrt = at::_foreach_pow(b2, t);
  at::_foreach_mul_(bc2_sqrt, -1);
  at::_foreach_add_(bc2_sqrt, 1);
  at::_foreach_sqrt_(bc2_sqrt);

  if (opts_.weight_decay != 0.0) at::_foreach_mul_(p, 1 - lr_eff * opts_.weight_decay);
  if (keep.defined()) {
    at::_foreach_mul_(m, 1 - keep * (1 - b1));
    at::_foreach_add_(m, g, 1 - b1);
    at::_foreach_mul_(v, 1 - keep * (1 - b2));
  } else {
    at::_foreach_lerp_(m, g, 1 - b1);
    at::_foreach_mul_(v, b2);
  }
  at::_foreach_addcmul_(v, g, g, 1 - b2);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, opts_.eps);
  std::vector<at::Tensor> update = at::_foreach_div(m, denom);
  at::_foreach_mul_(update, step_size);
  at::_foreach_sub_(p, update);
}

void AdamW::zero_grad() {
  for (at::Tensor& p : params_) p.mutable_grad().reset();
}

std::map<std::string, at::Tensor> AdamW::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string k = std::to_string(i);
    out["step." + k] = steps_[i].to(at::kCPU, false, true);
    out["exp_avg." + k] = exp_avg_[i].to(at::kCPU, false, true);
    out["exp_avg_sq." + k] = exp_avg_sq_[i].to(at::kCPU, false, true);
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  std::vector<const at::Tensor*> src;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string k = std::to_string(i);
    src.push_back(&state_entry(state, "step." + k, steps_[i], "AdamW"));
    src.push_back(&state_entry(state, "exp_avg." + k, exp_avg_[i], "AdamW"));
    src.push_back(&state_entry(state, "exp_avg_sq." + k, exp_avg_sq_[i], "AdamW"));
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    steps_[i].copy_(src[3 * i]->reshape({}));
    exp_avg_[i].copy_(*src[3 * i + 1]);
    exp_avg_sq_[i].copy_(*src[3 * i + 2]);
  }
}

CosineSchedule::CosineSchedule(double base_lr, int64_t total_steps, int64_t warmup_steps, double min_lr_ratio)
    : base_lr_(base_lr), min_lr_ratio_(min_lr_ratio), total_steps_(total_steps), warmup_steps_(warmup_steps) {
  if (total_steps < 1) throw InvalidArgument("schedule: total steps must be >= 1, got " + std::to_string(total_steps));
  if (warmup_steps < 0 || warmup_steps > total_steps)
    throw InvalidArgument("schedule: warmup steps must be in [0, " + std::to_string(total_steps) + "], got " +
                          std::to_string(warmup_steps));
  if (!(std::isfinite(base_lr) && base_lr >= 0.0)) throw InvalidArgument("schedule: base lr must be >= 0");
  if (!finite_in(min_lr_ratio, 0.0, 1.0)) throw InvalidArgument("schedule: min lr ratio must be in [0, 1]");
}

double CosineSchedule::lr(int64_t step) const {
  if (step < 0) step = 0;
  if (step < warmup_steps_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  if (step >= total_steps_) return base_lr_ * min_lr_ratio_;
  const double progress =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return base_lr_ * (min_lr_ratio_ + (1.0 - min_lr_ratio_) * cosine);
}

nlohmann::json CosineSchedule::to_json() const {
  return {{"base_lr", base_lr_},
          {"total_steps", total_steps_},
          {"warmup_steps", warmup_steps_},
          {"min_lr_ratio", min_lr_ratio_}};
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty())
    return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(params.empty() ? at::kCPU : params[0].device()));
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2, at::kFloat);
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  if (max_norm > 0.0) {
    const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

GradScaler::GradScaler(bool enabled, at::Device device, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval)
    : enabled_(enabled),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval) {
  if (enabled) {
    if (!(std::isfinite(init_scale) && init_scale > 0.0)) throw InvalidArgument("GradScaler: init_scale must be > 0");
    if (!(std::isfinite(growth_factor) && growth_factor > 1.0))
      throw InvalidArgument("GradScaler: growth_factor must be > 1");
    if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
      throw InvalidArgument("GradScaler: backoff_factor must be in (0, 1)");
    if (growth_interval < 1) throw InvalidArgument("GradScaler: growth_interval must be >= 1");
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({1}, enabled ? init_scale : 1.0, f32);
  growth_tracker_ = at::zeros({1}, f32.dtype(at::kInt));
  found_inf_ = at::zeros({1}, f32);
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!enabled_) return loss;
  return loss * scale_.reshape({});
}

void GradScaler::unscale(const std::vector<at::Tensor>& params) {
  if (!enabled_ || unscaled_) return;
  at::NoGradGuard no_grad;
  found_inf_.zero_();
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) by_dtype[p.grad().scalar_type()].push_back(p.grad());
  for (auto& [dtype, grads] : by_dtype) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
  unscaled_ = true;
}

void GradScaler::step(AdamW& opt, double lr, const std::vector<at::Tensor>& params) {
  if (!enabled_) {
    opt.step(lr);
    return;
  }
  unscale(params);
  opt.step(lr, {}, found_inf_);
  at::NoGradGuard no_grad;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, growth_factor_, backoff_factor_, growth_interval_);
  unscaled_ = false;
}

std::map<std::string, at::Tensor> GradScaler::state_dict() const {
  return {{"scale", scale_.to(at::kCPU, false, true)}, {"growth_tracker", growth_tracker_.to(at::kCPU, false, true)}};
}

void GradScaler::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const at::Tensor& s = state_entry(state, "scale", scale_, "GradScaler");
  const at::Tensor& g = state_entry(state, "growth_tracker", growth_tracker_, "GradScaler");
  scale_.copy_(s.reshape({1}));
  growth_tracker_.copy_(g.reshape({1}));
  unscaled_ = false;
}

}  // namespace melforge::trainer
