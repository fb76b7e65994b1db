#include "audio_stage.h"

#include <algorithm>

#include "build_state.h"
#include "featurize/featurize.h"
#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "stop.h"

namespace melforge::builder {

int64_t DecodeStage::batch_bytes(const PlannedFile& file) const {
  return file.plan.arena_samples * static_cast<int64_t>(sizeof(float));
}

int64_t DecodeStage::worker_bytes(const PlannedFile& file) const {
  int64_t bytes = audio::decode_bytes(file.info, decode_, file.plan.arena_samples);
  for (const double speed : speeds_) {
    audio::DecodeOptions at = decode_;
    at.sample_rate = augment::speed_decode_rate(decode_.sample_rate, speed);
    bytes = std::max(bytes, audio::decode_bytes(file.info, at, file.plan.arena_samples));
  }
  return bytes;
}

void DecodeStage::run(BatchFile& file) const {
  const PlannedFile& f = *file.file;
  audio::DecodeOptions decode = decode_;
  int64_t frames = f.frames;
  if (file.recipe.speed != 1.0) {
    decode.sample_rate = augment::speed_decode_rate(decode_.sample_rate, file.recipe.speed);
    frames = audio::output_frames(f.info, decode.sample_rate);
  }
  const int64_t take = featurize::decode_into(f.input->path, decode, f.plan, file.samples.data());
  std::fill(file.samples.begin() + take, file.samples.end(), 0.0f);
  file.decoded_frames = take < f.plan.arena_samples ? take : std::max(take, frames);
}

AudioStages make_audio_stages(const BuildConfig& config, const AudioStages& extra,
                              const std::shared_ptr<const AudioStage>& augment) {
  audio::DecodeOptions decode = config.decode;
  decode.sample_rate = config.mel.sample_rate;
  std::vector<double> speeds;
  if (config.augment.enabled()) speeds = config.augment.speed_list();
  AudioStages stages = {std::make_shared<DecodeStage>(decode, std::move(speeds))};
  if (augment) stages.push_back(augment);
  stages.insert(stages.end(), extra.begin(), extra.end());
  return stages;
}

void run_audio_stages(const AudioStages& stages, std::span<BatchFile> files, int threads, StageTimes& times,
                      Progress& progress) {
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const AudioStage& stage = *stages[k];
    const bool last = k + 1 == stages.size();
    ScopedStage timer(times, stage.name());
    if (stage.batched()) {
      check_stop();
      stage.run_batch(files);
      for (const BatchFile& file : files)
        if (last && file.error.empty()) progress.advance();
      continue;
    }
    parallel_for(static_cast<int64_t>(files.size()), threads, [&](int64_t i) {
      BatchFile& file = files[static_cast<std::size_t>(i)];
      if (!file.error.empty()) return;
      check_stop();
      try {
        stage.run(file);
      } catch (const AudioError& e) {
        file.error = *e.what() != '\0' ? e.what() : stage.name() + " failed";
        file.error_stage = stage.name();
      }
      if (last || !file.error.empty()) progress.advance();
    });
  }
}

}  // namespace melforge::builder
