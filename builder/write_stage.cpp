#include "write_stage.h"

#include <sys/stat.h>

#include <algorithm>

#include "augment_stage.h"
#include "melforge/common/h5.h"
#include "plan.h"
#include "reader/mel_info.h"

namespace melforge::builder {

bool has_groups(const ScanResult& scan) {
  return std::any_of(scan.files.begin(), scan.files.end(), [](const InputFile& f) { return !f.group.empty(); });
}

std::string build_identity(const BuildState& state) {
  std::vector<std::string> parts = {MELFORGE_VERSION, corpus_fingerprint(state.scan)};
  if (!state.test_trials.list.empty()) parts.push_back("test_trials=" + state.test_trials.digest);
  for (const Attribute& a : dataset_attributes(state))
    if (a.name != kBuildIdAttribute) parts.push_back(a.name + "=" + h5::to_string(a.value));
  for (const PlannedFile& f : state.usable) {
    struct stat st {};
    const bool known = ::stat(f.input->path.c_str(), &st) == 0;
    parts.push_back(f.input->rel_path + "\n" + std::to_string(f.frames) + "\n" +
                    (known ? std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
                                 std::to_string(st.st_mtim.tv_nsec)
                           : "?"));
  }
  return identity_hash(parts);
}

std::vector<Attribute> front_end_attributes(const mel::MelArgs& mel) {
  std::vector<Attribute> out = {{"features", mel::to_string(mel.features)}};
  if (mel.is_fbank())
    for (auto& [name, value] : data::fbank_attributes(mel.fbank)) out.push_back({name, std::move(value)});
  return out;
}

std::vector<Attribute> dataset_attributes(const BuildState& state) {
  const BuildConfig& c = state.config;
  const auto& m = c.mel;
  const ClipOptions& clips = c.clips;
  std::vector<Attribute> attributes = {
      {"sample_rate", int64_t{m.sample_rate}},
      {"n_fft", int64_t{m.n_fft}},
      {"win_length", int64_t{m.win()}},
      {"hop_length", int64_t{m.hop()}},
      {"window", mel::to_string(m.window)},
      {"center", int64_t{m.center ? 1 : 0}},
      {"pad_mode", mel::to_string(m.pad_mode)},
      {"power", double{m.power}},
      {"n_mels", int64_t{m.n_mels}},
      {"f_min", double{m.f_min}},
      {"f_max", double{m.fmax()}},
      {"mel_scale", mel::to_string(m.mel_scale)},
      {"mel_norm", mel::to_string(m.mel_norm)},
      {"log", mel::to_string(m.log)},
      {"amin", double{m.amin}},
      {"log_eps", double{m.log_eps}},
      {"dtype", mel::to_string(c.build.dtype)},
      {"short_seconds", clips.short_seconds},
      {"short_samples", clips.short_samples(m.sample_rate)},
      {"n_frames", clips.tile_frames(m.sample_rate, m.hop())},
      {"max_seconds", clips.max_seconds},
      {"channel", int64_t{c.decode.channel}},
      {"resampler", std::string(audio::kResampler)},
      {"resampler_quality", std::string(audio::kResamplerQuality)},
      {"resampler_phase", std::string(audio::kResamplerPhase)},
      {"resampler_version", audio::resampler_version()},
  };
  for (Attribute& a : front_end_attributes(m)) attributes.push_back(std::move(a));
  if (!state.build_id.empty()) attributes.push_back({kBuildIdAttribute, state.build_id});
  if (c.build.split_by != SplitBy::file) attributes.push_back({"split_by", to_string(c.build.split_by)});
  if (state.scan.folds > 0) attributes.push_back({"folds", int64_t{state.scan.folds}});
  if (const ShardSpec shard = c.build.shard_spec(); shard.sharded()) {
    attributes.push_back({"shard_index", int64_t{shard.index}});
    attributes.push_back({"shard_count", int64_t{shard.count}});
  }
  for (Attribute& a : augment_attributes(state)) attributes.push_back(std::move(a));
  if (state.speed_speakers.enabled()) {
    std::string factors;
    for (const double f : state.speed_speakers.factors) factors += (factors.empty() ? "" : ",") + speed_text(f);
    attributes.push_back({"speed_speakers", factors});
  }
  return attributes;
}

SplitOutputs::SplitOutputs(const BuildState& state, std::size_t split, const std::vector<WriteTarget>& targets,
                           const std::vector<Attribute>& attributes) {
  const BuildOptions& bo = state.config.build;
  for (const WriteTarget& target : targets) {
    SplitWriterConfig wc;
    wc.final_path = target.folder / (kSplitNames[split] + ".h5");
    wc.split = kSplitNames[split];
    wc.n_mels = state.config.mel.n_mels;
    wc.dtype = bo.dtype;
    wc.compression_level = target.compression_level;
    wc.shuffle = bo.shuffle;
    wc.frames_per_chunk = bo.frames_per_chunk;
    wc.threads = state.threads;
    wc.class_names = state.class_names;
    wc.multilabel = state.scan.multilabel;
    wc.augmented = state.augment != nullptr;
    wc.folds = state.scan.folds > 0;
    wc.groups = has_groups(state.scan);
    wc.speed_speakers = state.speed_speakers.enabled();
    wc.attributes = attributes;
    paths_.push_back(wc.final_path);
    writers_.push_back(std::make_unique<SplitWriter>(std::move(wc)));
  }
}

void SplitOutputs::append(const void* frames, const std::vector<FileRecord>& records) {
  for (const auto& w : writers_) w->append(frames, records);
}

void SplitOutputs::finish() {
  for (const auto& w : writers_) w->finish();
}

void SplitOutputs::add_to(std::vector<WriteTotals>& totals) const {
  for (std::size_t t = 0; t < writers_.size(); ++t) {
    totals[t].files.push_back(paths_[t]);
    totals[t].compress_s += writers_[t]->compress_seconds();
    totals[t].write_s += writers_[t]->write_seconds();
    totals[t].bytes += writers_[t]->bytes_written();
    totals[t].chunks += writers_[t]->chunks_written();
  }
}

}  // namespace melforge::builder
