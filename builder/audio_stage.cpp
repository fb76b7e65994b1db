#include "audio_stage.h"

#include <sys/stat.h>

#include <algorithm>

#include "build_state.h"
#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "stop.h"

namespace melforge::builder {

int64_t DecodeStage::batch_bytes(const PlannedCopy& row) const {
  return row.plan.samples * static_cast<int64_t>(sizeof(float));
}

audio::DecodeOptions DecodeStage::at_speed(double speed) const {
  audio::DecodeOptions decode = decode_;
  if (speed != 1.0) decode.sample_rate = augment::speed_decode_rate(decode_.sample_rate, speed);
  return decode;
}

int64_t DecodeStage::worker_bytes(const PlannedCopy& row) const {
  return audio::decode_bytes(row.file->info, at_speed(row.recipe.speed * row.speaker_speed), row.plan.samples);
}

void DecodeStage::run(BatchFile& file) const {
  const PlannedFile& f = *file.file;
  const audio::DecodeOptions decode = at_speed(file.recipe.speed * file.speaker_speed);
  const FileStamp before = file_stamp(f.input->path);
  if (f.stamp.size >= 0 && before != f.stamp) {
    audio::AudioInfo now;
    try {
      now = audio::probe(f.input->path);
    } catch (const AudioError&) {
    }
    throw AudioError(f.input->path.string() + ": " + change_since_probe(f.info, f.stamp, now, before));
  }
  if (file.samples.empty()) {
    file.decoded_frames = 0;
    return;
  }
  const audio::DecodedInto got = audio::decode_to(f.input->path, decode, file.samples);
  if (const std::string changed = change_since_probe(f.info, f.stamp, got.info, before); !changed.empty())
    throw AudioError(f.input->path.string() + ": " + changed);
  file.decoded_frames = got.frames;
  std::fill(file.samples.begin() + file.decoded_frames, file.samples.end(), 0.0f);
}

FileStamp file_stamp(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  const auto ns = [](const timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; };
  return {static_cast<int64_t>(st.st_size), ns(st.st_mtim), static_cast<uint64_t>(st.st_ino)};
}

std::string change_since_probe(const audio::AudioInfo& probed_info, const FileStamp& probed,
                               const audio::AudioInfo& now_info, const FileStamp& now) {
  std::string why;
  const auto add = [&why](const std::string& what, int64_t a, int64_t b) {
    if (a != b) why += (why.empty() ? "" : "; ") + what + " " + std::to_string(a) + " -> " + std::to_string(b);
  };
  if (probed.size >= 0) {
    if (now.size < 0) return "changed since it was probed: it can no longer be stat'ed (removed?)";
    add("size (bytes)", probed.size, now.size);
    if (probed.inode != now.inode) why += std::string(why.empty() ? "" : "; ") + "replaced (another inode)";
  }
  if (probed_info.frames > 0 && now_info.frames > 0) {
    add("frames", probed_info.frames, now_info.frames);
    add("sample rate (Hz)", probed_info.sample_rate, now_info.sample_rate);
    add("channels", probed_info.channels, now_info.channels);
  }
  if (why.empty() && probed.size >= 0 && probed.mtime_ns != now.mtime_ns)
    why = "modified (its modification time moved)";
  return why.empty() ? why : "changed since it was probed: " + why + "; not stored (build again to include it)";
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
