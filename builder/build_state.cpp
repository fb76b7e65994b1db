#include "build_state.h"

#include "augment_stage.h"
#include "melforge/common/parallel.h"

namespace melforge::builder {

BuildState::BuildState(const BuildConfig& c, const AudioStages& extra_stages)
    : config(c),
      sample_rate(c.mel.sample_rate),
      threads(resolve_threads(c.build.threads)),
      augment(c.augment.enabled() ? std::make_shared<AugmentStage>(c.augment, c.mel.sample_rate) : nullptr),
      audio_stages(make_audio_stages(c, extra_stages, augment)) {}

int64_t BuildState::held_bytes() const { return engine->host_bytes() + (augment ? augment->held_bytes() : 0); }

int64_t BuildState::out_bytes_per_file() const {
  return int64_t{num_long} * num_short * engine->layout().out_bytes_per_segment();
}

featurize::BatchLayout BuildState::batch_layout() const {
  return {num_long, num_short, config.segment.long_samples(sample_rate), config.segment.short_samples(sample_rate)};
}

}  // namespace melforge::builder
