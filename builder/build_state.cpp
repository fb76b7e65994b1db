#include "build_state.h"

#include <algorithm>

#include "augment_stage.h"
#include "melforge/common/parallel.h"

namespace melforge::builder {

BuildState::BuildState(const BuildConfig& c, const AudioStages& extra_stages)
    : config(c),
      sample_rate(c.mel.sample_rate),
      threads(resolve_threads(c.build.threads)),
      augment(c.augment.enabled() ? std::make_shared<AugmentStage>(c.augment, c.mel.sample_rate) : nullptr),
      audio_stages(make_audio_stages(c, extra_stages, augment)),
      max_samples(c.clips.max_samples(c.mel.sample_rate)) {}

int64_t BuildState::held_bytes() const { return engine->host_bytes() + (augment ? augment->held_bytes() : 0); }

int64_t BuildState::frame_bytes() const {
  return int64_t{config.mel.n_mels} * (config.build.dtype == mel::DType::float16 ? 2 : 4);
}

ClipPlan BuildState::row_plan(const PlannedFile& file, double speed) const {
  if (speed == 1.0) return file.plan;
  const int64_t samples = audio::output_frames(file.info, augment::speed_decode_rate(sample_rate, speed));
  return plan_clip(samples, max_samples, config.mel);
}

std::vector<double> BuildState::row_speeds() const {
  std::vector<double> speeds = {1.0};
  if (config.augment.enabled())
    for (const double s : config.augment.speed_list())
      if (s != 1.0) speeds.push_back(s);
  return speeds;
}

int32_t BuildState::row_label(const PlannedFile& file, int speaker) const {
  const int32_t label = class_index.at(file.input->label);
  if (speaker < 0) return label;
  return speed_speakers.labels.at(static_cast<std::size_t>(speaker)).at(static_cast<std::size_t>(label));
}

}  // namespace melforge::builder
