#include "audio_stage.h"

#include <algorithm>

#include "build_state.h"
#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "stop.h"

namespace melforge::builder {

int64_t DecodeStage::batch_bytes(const PlannedCopy& row) const {
  return row.plan.samples * static_cast<int64_t>(sizeof(float));
}

audio::DecodeOptions DecodeStage::at_speed(const augment::Recipe& recipe) const {
  audio::DecodeOptions decode = decode_;
  if (recipe.speed != 1.0) decode.sample_rate = augment::speed_decode_rate(decode_.sample_rate, recipe.speed);
  return decode;
}

int64_t DecodeStage::worker_bytes(const PlannedCopy& row) const {
  return audio::decode_bytes(row.file->info, at_speed(row.recipe), row.plan.samples);
}

void DecodeStage::run(BatchFile& file) const {
  const PlannedFile& f = *file.file;
  const audio::DecodeOptions decode = at_speed(file.recipe);
  file.decoded_frames = file.samples.empty() ? 0 : audio::decode_to(f.input->path, decode, file.samples).frames;
  std::fill(file.samples.begin() + file.decoded_frames, file.samples.end(), 0.0f);
}

AudioStages make_audio_stages(const BuildConfig& config, const AudioStages& extra,
                              const std::shared_ptr<const AudioStage>& augment) {
  audio::DecodeOptions decode = config.decode;
  decode.sample_rate = config.mel.sample_rate;
  AudioStages stages = {std::make_shared<DecodeStage>(decode)};
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
