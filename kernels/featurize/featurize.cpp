#include "featurize/featurize.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "mel/half.h"
#include "melforge/common/errors.h"

namespace melforge::featurize {

PlannedAudio plan_audio(const std::filesystem::path& path, const segment::SegmentArgs& segment, int sample_rate,
                        int num_long) {
  PlannedAudio p;
  p.info = audio::probe(path);
  p.frames = audio::output_frames(p.info, sample_rate);
  p.plan = segment::plan_file(p.frames, segment, sample_rate, num_long);
  return p;
}

int64_t decode_into(const std::filesystem::path& path, const audio::DecodeOptions& decode,
                    const segment::FilePlan& plan, float* dst) {
  return audio::decode_to(path, decode, std::span<float>(dst, static_cast<std::size_t>(plan.arena_samples))).frames;
}

void fill_silence(void* out, int64_t count, mel::DType dtype, float value) {
  if (dtype == mel::DType::float32) {
    std::fill_n(static_cast<float*>(out), count, value);
  } else {
    std::fill_n(static_cast<uint16_t*>(out), count, mel::float_to_half_bits(value));
  }
}

void compute_files(mel::MelEngine& engine, const float* arena, std::span<const int64_t> arena_offsets,
                   std::span<const int> num_valid_long, const BatchLayout& layout, mel::DType dtype, float silence,
                   void* out, std::vector<uint8_t>& scratch) {
  if (arena_offsets.size() != num_valid_long.size())
    throw InvalidArgument("compute_files: " + std::to_string(arena_offsets.size()) + " offsets but " +
                          std::to_string(num_valid_long.size()) + " valid counts");
  const mel::MelLayout& ml = engine.layout();
  const int64_t files = static_cast<int64_t>(arena_offsets.size());
  const int64_t seg_bytes = ml.out_bytes_per_segment();
  const int64_t segs_per_file = int64_t{layout.num_long} * layout.num_short;
  const int64_t out_bytes_per_file = segs_per_file * seg_bytes;

  std::vector<int64_t> offsets;
  bool all_full = true;
  for (int64_t i = 0; i < files; ++i) {
    const int valid = num_valid_long[static_cast<std::size_t>(i)];
    if (valid < 1 || valid > layout.num_long)
      throw InvalidArgument("compute_files: num_valid_long " + std::to_string(valid) + " outside [1, " +
                            std::to_string(layout.num_long) + "]");
    all_full = all_full && valid == layout.num_long;
    for (int l = 0; l < valid; ++l)
      for (int s = 0; s < layout.num_short; ++s)
        offsets.push_back(arena_offsets[static_cast<std::size_t>(i)] + l * layout.long_samples +
                          s * layout.short_samples);
  }
  auto* dst = static_cast<uint8_t*>(out);
  if (all_full) {
    engine.compute(arena, offsets, dst);
    return;
  }
  scratch.resize(static_cast<std::size_t>(static_cast<int64_t>(offsets.size()) * seg_bytes));
  engine.compute(arena, offsets, scratch.data());
  fill_silence(dst, files * segs_per_file * ml.out_elems_per_segment(), dtype, silence);
  int64_t src = 0;
  for (int64_t i = 0; i < files; ++i) {
    const int64_t bytes_valid = int64_t{num_valid_long[static_cast<std::size_t>(i)]} * layout.num_short * seg_bytes;
    std::memcpy(dst + i * out_bytes_per_file, scratch.data() + src, static_cast<std::size_t>(bytes_valid));
    src += bytes_valid;
  }
}

FileFeatures featurize_file(const std::filesystem::path& path, mel::MelEngine& engine, const mel::MelArgs& mel,
                            const segment::SegmentArgs& segment, int channel, int num_long, mel::DType dtype) {
  const int sr = mel.sample_rate;
  const PlannedAudio p = plan_audio(path, segment, sr, num_long);
  if (!p.plan.skip_reason.empty()) throw AudioError(path.string() + ": " + p.plan.skip_reason);
  audio::DecodeOptions decode;
  decode.sample_rate = sr;
  decode.channel = channel;
  std::vector<float> arena(static_cast<std::size_t>(p.plan.arena_samples), 0.0f);
  decode_into(path, decode, p.plan, arena.data());

  BatchLayout layout;
  layout.num_long = num_long;
  layout.num_short = segment.num_short(sr);
  layout.long_samples = segment.long_samples(sr);
  layout.short_samples = segment.short_samples(sr);
  const int64_t out_bytes = int64_t{num_long} * layout.num_short * engine.layout().out_bytes_per_segment();
  FileFeatures f;
  f.bytes.resize(static_cast<std::size_t>(out_bytes));
  f.num_valid_long = p.plan.num_valid_long;
  const int64_t offset = 0;
  std::vector<uint8_t> scratch;
  compute_files(engine, arena.data(), std::span<const int64_t>(&offset, 1),
                std::span<const int>(&f.num_valid_long, 1), layout, dtype, mel::silence_value(mel), f.bytes.data(),
                scratch);
  return f;
}

Featurizer::Featurizer(const DatasetParams& params, int threads) : params_(params) {
  params_.segment.num_long = static_cast<int>(params.num_long);
  const int sr = params_.mel.sample_rate;
  try {
    params_.segment.validate(sr);
    params_.mel.validate(params_.segment.short_samples(sr));
    mel::EngineConfig ec;
    ec.mel = params_.mel;
    ec.segment_samples = params_.segment.short_samples(sr);
    ec.dtype = params_.dtype;
    ec.threads = threads;
    engine_ = mel::make_cpu_engine(ec);
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("the dataset parameters cannot be used for spectrograms: ") + e.what());
  }
  const mel::MelLayout& layout = engine_->layout();
  const segment::SegmentArgs& s = params_.segment;
  if (layout.n_mels != params.n_mels || layout.n_frames != params.n_frames || s.num_short(sr) != params.num_short ||
      s.long_samples(sr) != params.long_samples || s.short_samples(sr) != params.short_samples || params.num_long < 1)
    throw FormatError("the dataset parameters are inconsistent: they give " + std::to_string(layout.n_mels) + " x " +
                      std::to_string(layout.n_frames) + " spectrograms and " + std::to_string(s.num_short(sr)) +
                      " short segments, the attributes say " + std::to_string(params.n_mels) + " x " +
                      std::to_string(params.n_frames) + " and " + std::to_string(params.num_short));
}

FloatFeatures Featurizer::operator()(const std::filesystem::path& path) {
  const DatasetParams& p = params_;
  const FileFeatures f =
      featurize_file(path, *engine_, p.mel, p.segment, p.channel, static_cast<int>(p.num_long), p.dtype);
  FloatFeatures out;
  out.num_valid_long = f.num_valid_long;
  const auto n = static_cast<std::size_t>(p.num_long * p.num_short * p.n_mels * p.n_frames);
  out.values.resize(n);
  to_float(f.bytes.data(), p.dtype, out.values);
  return out;
}

void to_float(const void* bytes, mel::DType dtype, std::span<float> out) {
  if (dtype == mel::DType::float32) {
    std::memcpy(out.data(), bytes, out.size() * sizeof(float));
  } else {
    const auto* src = static_cast<const uint16_t*>(bytes);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = mel::half_bits_to_float(src[i]);
  }
}

}  // namespace melforge::featurize
