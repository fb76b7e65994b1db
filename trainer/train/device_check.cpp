#include "train/device_check.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/timing.h"
#include "train/rng_state.h"
#include "util.h"

namespace melforge::trainer {

namespace device_check_detail {

// Tolerances. Under autocast the device rounds the inputs of every convolution and matmul and the output of most
// layers to bf16 or fp16 (sums are accumulated in float32); with TF32 it rounds the inputs of the float32 convolutions
// and matmuls to TF32's 10-bit mantissa. Each such layer then carries a relative error of about one or two unit
// roundoffs u (2^-8 for bf16, 2^-11 for fp16 and TF32), and the errors of the layers add up like a random walk:
// for resnet-se's ~40 rounded layers about 2u * sqrt(40) ~ 13u at most. Measured on the CPU (the Python twins of
// cnn, crnn, resnet-se and ecapa, python/melforge/models.py, at initialisation, eval mode, 3 seeds, bf16 and fp16
// autocast against float32; fp16 stands in for TF32, which rounds at fewer places): max |logit difference| = 0.8u
// to 2.6u of the logits' scale, loss differences <= 0.2u. 32u leaves more than 10x room above those figures for
// trained weights and longer error chains, and is still far below what a wrong kernel, a wrong weight or a corrupted
// batch does to the logits (an error of the order of their scale: 0.3 and more). So 32u: bf16 12.5 %, fp16 and TF32
// 1.56 %.
constexpr double kReducedPrecisionUnits = 32;
// float32 on both sides (the CPU under the test hook, or CUDA with TF32 switched off) differs only in the order of
// the sums (an error growing like sqrt(n) u for n terms: up to ~1000u for the largest reductions) and in cuDNN's
// Winograd and FFT convolutions, which lose a few more bits; 2^-13 (2048u, 1.2e-4) covers both. A CPU compared with
// itself gives exactly 0.
constexpr double kFloat32Tolerance = 1.0 / 8192;

/// Restores the CPU generator's state at the end of its scope.
class CpuGeneratorGuard {
 public:
  CpuGeneratorGuard() : state_(rng_state(at::kCPU)) {}
  ~CpuGeneratorGuard() { set_rng_state(state_, at::kCPU); }
  CpuGeneratorGuard(const CpuGeneratorGuard&) = delete;
  CpuGeneratorGuard& operator=(const CpuGeneratorGuard&) = delete;

 private:
  at::Tensor state_;
};

/// Puts a module in eval mode for its scope and restores its training mode at the end.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(torch::nn::Module& m) : module_(m), was_training_(m.is_training()) { m.eval(); }
  ~EvalModeGuard() { module_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

/// Copies every tensor of `from` into the tensor of the same name in `to` (same shapes), `what` naming the kind.
void copy_named(const torch::OrderedDict<std::string, at::Tensor>& from,
                torch::OrderedDict<std::string, at::Tensor>& to, const char* what) {
  if (from.size() != to.size())
    throw Error(
        fmt("device check: the CPU copy of the model has %zu %ss, the model %zu", to.size(), what, from.size()));
  for (const auto& item : from) {
    at::Tensor* dst = to.find(item.key());
    if (dst == nullptr || !dst->sizes().equals(item.value().sizes()))
      throw Error("device check: the CPU copy of the model has no " + std::string(what) + " '" + item.key() +
                  "' of shape " + shape_text(item.value().sizes()));
    dst->copy_(item.value());
  }
}

/// The logits and (when defined) the detection logits of `out`, flattened into one float32 CPU vector.
at::Tensor compared_values(const ModelOutput& out) {
  std::vector<at::Tensor> parts{out.logits.detach().to(at::kCPU, at::kFloat).reshape({-1})};
  if (out.detection.defined()) parts.push_back(out.detection.detach().to(at::kCPU, at::kFloat).reshape({-1}));
  return at::cat(parts);
}

/// `out` with its logits and detection logits multiplied by 1 + `fault` (the test hook).
ModelOutput perturbed(ModelOutput out, double fault) {
  out.logits = out.logits * (1.0 + fault);
  if (out.detection.defined()) out.detection = out.detection * (1.0 + fault);
  return out;
}

/// Fills the figures of `r` from both sides' outputs and losses, and its result.
void compare(DeviceCheckResult& r, const ModelOutput& dev, const at::Tensor& dev_loss, const ModelOutput& cpu,
             const at::Tensor& cpu_loss) {
  const at::Tensor a = compared_values(dev), b = compared_values(cpu);
  if (!a.sizes().equals(b.sizes()))
    throw Error("device check: the device gives " + shape_text(a.sizes()) + " logits, the CPU " +
                shape_text(b.sizes()));
  r.logits_max_abs_diff = (a - b).abs().max().item<double>();
  r.logits_scale = b.abs().max().item<double>();
  r.logits_rel_diff = r.logits_max_abs_diff / std::max(r.logits_scale, 1e-30);
  r.loss_device = dev_loss.detach().to(at::kCPU, at::kDouble).item<double>();
  r.loss_cpu = cpu_loss.detach().to(at::kCPU, at::kDouble).item<double>();
  r.loss_rel_diff = std::abs(r.loss_device - r.loss_cpu) / std::max(std::abs(r.loss_cpu), 1.0);
  const bool ok = r.logits_rel_diff <= r.precision.logits_tolerance && r.loss_rel_diff <= r.precision.loss_tolerance;
  r.result = ok ? "passed" : "failed";
}

/// A number for JSON: null when not finite.
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace device_check_detail

std::optional<double> device_check_fault() {
  const char* v = std::getenv(kDeviceCheckFaultVariable);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(d) || d < 0)
    throw InvalidArgument(std::string(kDeviceCheckFaultVariable) + " (the device check's fault-injection test hook) "
                          "must be a finite number >= 0, got '" + v + "'");
  return d;
}

CheckPrecision check_precision(at::Device device, at::ScalarType autocast) {
  CheckPrecision p;
  if (autocast == at::kBFloat16) {
    p.name = "bf16";
    p.unit_roundoff = std::ldexp(1.0, -8);
  } else if (autocast == at::kHalf) {
    p.name = "fp16";
    p.unit_roundoff = std::ldexp(1.0, -11);
  } else if (device.is_cuda() && (at::globalContext().allowTF32CuBLAS() || at::globalContext().allowTF32CuDNN())) {
    p.name = "tf32";
    p.unit_roundoff = std::ldexp(1.0, -11);
  } else {
    p.name = "fp32";
    p.unit_roundoff = std::ldexp(1.0, -24);
    p.logits_tolerance = p.loss_tolerance = device_check_detail::kFloat32Tolerance;
    return p;
  }
  p.logits_tolerance = p.loss_tolerance = device_check_detail::kReducedPrecisionUnits * p.unit_roundoff;
  return p;
}

DeviceCheckResult DeviceCheckResult::not_run(std::string result, std::string reason) {
  DeviceCheckResult r;
  r.result = std::move(result);
  r.reason = std::move(reason);
  return r;
}

nlohmann::json DeviceCheckResult::to_json() const {
  using device_check_detail::finite_or_null;
  if (result != "passed" && result != "failed") return {{"result", result}, {"reason", reason}};
  nlohmann::json j = {{"result", result},
                      {"device", device},
                      {"reference", "cpu"},
                      {"precision", precision.name},
                      {"mode", "eval"},
                      {"examples", examples},
                      {"logits_max_abs_diff", finite_or_null(logits_max_abs_diff)},
                      {"logits_scale", finite_or_null(logits_scale)},
                      {"logits_rel_diff", finite_or_null(logits_rel_diff)},
                      {"logits_tolerance", precision.logits_tolerance},
                      {"loss_device", finite_or_null(loss_device)},
                      {"loss_cpu", finite_or_null(loss_cpu)},
                      {"loss_rel_diff", finite_or_null(loss_rel_diff)},
                      {"loss_tolerance", precision.loss_tolerance},
                      {"cpu_seconds", cpu_seconds}};
  if (fault) j["fault_injected"] = *fault;
  return j;
}

std::string DeviceCheckResult::summary() const {
  if (result != "passed" && result != "failed") {
    std::string state = result;
    std::replace(state.begin(), state.end(), '_', ' ');
    return "device check " + state + ": " + reason;
  }
  return fmt("device check %s on %s (%s, eval mode, the %lld examples of the first batch, against float32 on a CPU "
             "copy%s): logits differ by up to %.3g = %.3g %% of their scale %.3g (tolerance %.3g %%); loss %.6g on "
             "the device vs %.6g on the CPU, a relative difference of %.3g %% (tolerance %.3g %%)",
             result.c_str(), device.c_str(), precision.name.c_str(), static_cast<long long>(examples),
             fault ? fmt("; fault injected by %s: %g", kDeviceCheckFaultVariable, *fault).c_str() : "",
             logits_max_abs_diff, 100.0 * logits_rel_diff, logits_scale, 100.0 * precision.logits_tolerance,
             loss_device, loss_cpu, 100.0 * loss_rel_diff, 100.0 * precision.loss_tolerance);
}

std::shared_ptr<Classifier> cpu_copy(Classifier& model) {
  std::shared_ptr<Classifier> copy;
  {
    const device_check_detail::CpuGeneratorGuard keep_generator;
    copy = make_model_from_json(model.config_json(), /*any_task=*/true);
  }
  const at::NoGradGuard no_grad;
  auto params = copy->named_parameters();
  auto buffers = copy->named_buffers();
  device_check_detail::copy_named(model.named_parameters(), params, "parameter");
  device_check_detail::copy_named(model.named_buffers(), buffers, "buffer");
  copy->train(model.is_training());
  return copy;
}

DeviceCheckResult run_device_check(Classifier& model, const at::Tensor& x, const at::Tensor& lengths,
                                   at::ScalarType autocast, const CheckLoss& loss, std::optional<double> fault) {
  DeviceCheckResult r;
  r.device = x.device().str();
  r.precision = check_precision(x.device(), autocast);
  r.examples = x.size(0);
  r.fault = fault;
  const at::NoGradGuard no_grad;
  ModelOutput dev;
  at::Tensor dev_loss;
  {
    const device_check_detail::EvalModeGuard eval(model);
    const AutocastGuard autocast_scope(x.device().type(), autocast);
    dev = model.forward(x, lengths);
    if (fault) dev = device_check_detail::perturbed(std::move(dev), *fault);
    dev_loss = loss(dev);
  }
  const Stopwatch watch;
  const std::shared_ptr<Classifier> reference = cpu_copy(model);
  reference->eval();
  const ModelOutput cpu = reference->forward(x.to(at::kCPU).contiguous(),
                                             lengths.defined() ? lengths.to(at::kCPU) : lengths);
  const at::Tensor cpu_loss = loss(cpu);
  r.cpu_seconds = watch.seconds();
  device_check_detail::compare(r, dev, dev_loss, cpu, cpu_loss);
  return r;
}

}  // namespace melforge::trainer
