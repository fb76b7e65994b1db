#include "train/profiling.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <utility>

#if defined(MELFORGE_TRAINER_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define MELFORGE_TRAINER_NVTX 1
#endif

namespace melforge::trainer {

TraceRange::TraceRange(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
  if (rf_.isActive()) rf_.before(name);
#ifdef MELFORGE_TRAINER_NVTX
  nvtxRangePushA(name);
#endif
}

TraceRange::~TraceRange() {
#ifdef MELFORGE_TRAINER_NVTX
  nvtxRangePop();
#endif
}

StepProfiler::StepProfiler(int64_t steps, std::filesystem::path path, bool cuda)
    : steps_(steps), path_(std::move(path)) {
  if (steps_ <= 0) return;
  using namespace torch::profiler::impl;
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  active_ = true;
}

void StepProfiler::step() {
  if (active_ && ++done_ >= steps_) finish();
}

void StepProfiler::finish() {
  if (!active_) return;
  active_ = false;
  auto result = torch::autograd::profiler::disableProfiler();
  if (result) result->save(path_.string());
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (...) {
  }
}

}  // namespace melforge::trainer
