#pragma once
/// The device check of `train` (issue 27): on CUDA, the first training batch's forward pass runs once more on the
/// device and once on a CPU copy of the model with the same weights, and the logits and the training loss of the two
/// are compared at a tolerance of the device's arithmetic (fp32, TF32, bf16 or fp16). A device that computes
/// something else than the CPU (a faulty GPU, driver or kernel) stops the run before its first optimizer step.
///
/// Both forwards run in eval mode under no-grad: dropout is the identity and BatchNorm uses its running statistics, so
/// the two sides compute the same function of the same weights without drawing a random number, and nothing of the
/// device model changes (no gradient, no running-statistics update, its training mode restored). A run therefore has
/// the same result with and without the check. The device side runs under the run's autocast dtype, as training does;
/// the CPU side in float32.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/model.h"

namespace melforge::trainer {

/// The fault-injection test hook: with MELFORGE_DEVICE_CHECK_FAULT=D set, the check also runs when the device is the
/// CPU (the run's own model then plays the device and its CPU copy the reference), and the device side's logits and
/// detection logits are multiplied by 1 + D before they are compared and the loss is computed from them. D = 0
/// compares the CPU with itself (a zero difference); D above the tolerance must make the run fail.
inline constexpr const char* kDeviceCheckFaultVariable = "MELFORGE_DEVICE_CHECK_FAULT";

/// MELFORGE_DEVICE_CHECK_FAULT's value D; nullopt when it is unset or empty. Throws InvalidArgument naming the
/// variable when it is not a finite number >= 0.
std::optional<double> device_check_fault();

/// The arithmetic of the device side, and the tolerances that follow from it (device_check.cpp says why).
struct CheckPrecision {
  /// `fp32` (no reduced precision: the CPU under the test hook, or CUDA with TF32 off), `tf32` (CUDA float32 with
  /// TF32 matmuls or convolutions, which configure_cuda allows), `bf16` or `fp16` (the autocast dtype).
  std::string name = "fp32";
  /// The unit roundoff u of the products the device rounds to: 2^-24 (fp32), 2^-11 (tf32: 10 stored mantissa bits;
  /// fp16: 11 bits with the implicit one) or 2^-8 (bf16: 8 bits with the implicit one).
  double unit_roundoff = 0;
  /// The largest accepted max |device logit - CPU logit| / max |CPU logit|.
  double logits_tolerance = 0;
  /// The largest accepted |device loss - CPU loss| / max(|CPU loss|, 1).
  double loss_tolerance = 0;
};

/// The precision of a forward pass on `device` under `autocast` (at::kFloat: none, at::kBFloat16, at::kHalf): bf16 or
/// fp16 under autocast; else tf32 on CUDA when at::globalContext() allows TF32 for cuBLAS or cuDNN, fp32 otherwise.
CheckPrecision check_precision(at::Device device, at::ScalarType autocast);

/// What the check found, or why it did not run: config.json's `device_check` object and the log line.
struct DeviceCheckResult {
  /// `passed`, `failed`, `skipped` (--no-device-check), `not_applicable` (the device is the CPU), `pending` (a CUDA
  /// run before its first training batch) or `not_run` (the process trained no batch, e.g. a finished run resumed).
  std::string result = "pending";
  /// Why it did not run (every result but passed and failed); empty otherwise.
  std::string reason;
  /// The device checked ("cuda:0"; "cpu" under the test hook).
  std::string device;
  /// The device side's arithmetic and the tolerances applied.
  CheckPrecision precision;
  /// Examples of the first batch compared (its size B).
  int64_t examples = 0;
  /// max |device - CPU| over the logits [B, C] and the detection logits [B] (when the model has them), max |CPU
  /// value| over the same, and their ratio (compared with precision.logits_tolerance).
  double logits_max_abs_diff = 0, logits_scale = 0, logits_rel_diff = 0;
  /// The training loss of the batch on each side (without SpecAugment or mixup), and |device - CPU| / max(|CPU|, 1)
  /// (compared with precision.loss_tolerance).
  double loss_device = 0, loss_cpu = 0, loss_rel_diff = 0;
  /// The test hook's D (MELFORGE_DEVICE_CHECK_FAULT), when it was set.
  std::optional<double> fault;
  /// Seconds of the CPU side (copy, forward and loss).
  double cpu_seconds = 0;

  /// Whether the result is `passed`.
  bool passed() const { return result == "passed"; }
  /// {"result", "reason"} for a check that did not run; otherwise {"result", "device", "reference": "cpu",
  /// "precision", "mode": "eval", "examples", the figures, both tolerances, "cpu_seconds"} and "fault_injected" when
  /// set.
  nlohmann::json to_json() const;
  /// One line: the result, the device and precision, the figures and the tolerances, or why it did not run
  /// ("device check skipped: --no-device-check").
  std::string summary() const;
  /// A result without figures: `result` (skipped, not_applicable, pending or not_run) and its `reason`.
  static DeviceCheckResult not_run(std::string result, std::string reason);
};

/// The training loss of one forward pass's output (a float scalar tensor), computed on that output's device.
using CheckLoss = std::function<at::Tensor(const ModelOutput&)>;

/// A deep copy of `model` on the CPU: the same architecture (make_model_from_json of its config_json()), every
/// parameter and buffer copied, the same training mode. The CPU generator's state is restored after the copy's
/// initialisation, so the copy draws nothing from the run's generator. Throws Error when the copy's parameters or
/// buffers do not match the model's by name and shape.
std::shared_ptr<Classifier> cpu_copy(Classifier& model);

/// Runs the check on `x` (the batch on the model's device, [B, M, T] or [B, 1, M, T]): `model` in eval mode under
/// `autocast` on x's device (outputs multiplied by 1 + *fault when `fault` is set), and cpu_copy(model) in eval mode
/// in float32 on the CPU, each followed by `loss`; then compares them (result `passed` or `failed`). The model's
/// parameters, buffers and training mode are left as they were. Throws what the forward passes or `loss` throw.
DeviceCheckResult run_device_check(Classifier& model, const at::Tensor& x, const at::Tensor& lengths,
                                   at::ScalarType autocast, const CheckLoss& loss, std::optional<double> fault);

}  // namespace melforge::trainer
