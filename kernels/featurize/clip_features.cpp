#include "featurize/clip_features.h"

#include <string>

#include "audio/decode.h"
#include "featurize/featurize.h"
#include "melforge/common/errors.h"

namespace melforge::featurize {

ClipFeaturizer::ClipFeaturizer(const mel::MelArgs& mel, mel::DType dtype, int channel, int threads)
    : mel_(mel), dtype_(dtype), channel_(channel) {
  try {
    mel_.validate();
    mel::EngineConfig ec;
    ec.mel = mel_;
    ec.segment_samples = mel_.n_fft;
    ec.dtype = dtype_;
    ec.threads = threads;
    engine_ = mel::make_cpu_engine(ec);
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("the dataset parameters cannot be used for spectrograms: ") + e.what());
  }
}

ClipFeaturizer::~ClipFeaturizer() = default;

ClipFeatures ClipFeaturizer::compute(const std::vector<float>& samples) {
  const int64_t offsets[2] = {0, static_cast<int64_t>(samples.size())};
  const mel::ClipBatch batch = mel::plan_clips(mel_, dtype_, offsets);
  std::vector<uint8_t> bytes(static_cast<std::size_t>(batch.out_bytes()));
  engine_->compute_clips(samples.data(), batch, bytes.data());
  ClipFeatures f;
  f.n_frames = batch.frames(0);
  f.n_mels = batch.n_mels;
  f.num_samples = offsets[1];
  f.flags = batch.flags[0];
  f.frames.resize(static_cast<std::size_t>(batch.out_elems()));
  to_float(bytes.data(), dtype_, f.frames);
  return f;
}

ClipFeatures ClipFeaturizer::operator()(const std::filesystem::path& path) {
  audio::DecodeOptions decode;
  decode.sample_rate = mel_.sample_rate;
  decode.channel = channel_;
  return compute(audio::decode(path, decode).samples);
}

}  // namespace melforge::featurize
