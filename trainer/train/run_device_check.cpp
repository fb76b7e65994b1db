#include <utility>

#include "data/loader.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "train/device_check.h"
#include "train/profiling.h"
#include "train/run.h"
#include "util.h"

namespace melforge::trainer {

void Run::plan_device_check() {
  check_fault_ = device_check_fault();
  if (cfg_.train.no_device_check) {
    device_check_ = DeviceCheckResult::not_run("skipped", "--no-device-check");
    log_.info(device_check_.summary());
  } else if (!s_.device.is_cuda() && !check_fault_) {
    device_check_ = DeviceCheckResult::not_run("not_applicable", "the device is the CPU, the check's reference");
    log_.debug(device_check_.summary());
  } else {
    device_check_ = DeviceCheckResult::not_run("pending", "runs on the first training batch");
  }
  if (check_fault_)
    log_.warn(fmt("%s=%g is set: the device check runs with the device side's logits multiplied by %g (a test hook)%s",
                  kDeviceCheckFaultVariable, *check_fault_, 1.0 + *check_fault_,
                  s_.device.is_cuda() ? "" : "; on the CPU the run's model plays the device"));
}

void Run::check_device(const Batch& batch) {
  TraceRange range("device check");
  at::Tensor x = batch.x;
  if (cfg_.train.channels_last && s_.device.is_cuda()) x = x.unsqueeze(1).contiguous(at::MemoryFormat::ChannelsLast);
  DeviceCheckResult r = run_device_check(
      *model_, x, batch.lengths, s_.autocast, [&](const ModelOutput& out) { return training_loss(out, batch); }, check_fault_);
  const std::string line = (world_ > 1 ? fmt("rank %d: ", rank_) : std::string()) + r.summary();
  const bool passed = r.passed();
  record_device_check(std::move(r));
  if (!passed)
    throw Error(line + ": the device does not compute what the CPU computes with the same weights (a faulty GPU, "
                "driver or kernel?); stopped before the first optimizer step. --no-device-check trains without the "
                "check");
  rank_log_.info(line);
}

void Run::record_device_check(DeviceCheckResult result) {
  device_check_ = std::move(result);
  config_json_["device_check"] = device_check_.to_json();
  if (writer()) write_json_atomically(run_dir_ / "config.json", config_json_);
}

}  // namespace melforge::trainer
