#pragma once
/// Per-file featurization shared by melforge-build and melforge-train predict: header probe and segment plan,
/// decode into a zero-padded arena slice, then the spectrograms of every valid short segment of a batch of files
/// with the slots of invalid long segments filled with the silence value. Both programs call these functions, so a
/// file's features are the same bytes in a dataset and at prediction time.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "audio/decode.h"
#include "mel/mel_args.h"
#include "mel/mel_engine.h"
#include "segment/segment_args.h"

namespace melforge::featurize {

/// A file planned from its header.
struct PlannedAudio {
  /// What the header says.
  audio::AudioInfo info;
  /// Frames after decoding at the target rate (audio::output_frames).
  int64_t frames = 0;
  /// How the file is segmented; plan.skip_reason is non-empty when the file is skipped.
  segment::FilePlan plan;
};

/// Probes `path` and plans it with `num_long` long segments per file at `sample_rate` Hz. Throws AudioError
/// ("<path>: <reason>") when the header cannot be read; a file that is too short is returned with a skip reason.
PlannedAudio plan_audio(const std::filesystem::path& path, const segment::SegmentArgs& segment, int sample_rate,
                        int num_long);

/// Decodes `path` (mono or one channel, at decode.sample_rate) into dst[0, plan.arena_samples), reading the file only
/// as far as the arena needs (audio::decode_to, which streams into `dst` with no second copy of the audio): the first
/// min(decoded, arena_samples) samples, the rest left as the caller filled them (zero). Returns the samples written.
/// Throws AudioError when the part of the file read cannot be decoded. melforge-build's decode stage calls it too.
int64_t decode_into(const std::filesystem::path& path, const audio::DecodeOptions& decode,
                    const segment::FilePlan& plan, float* dst);

/// Fills `count` output elements of `dtype` (float16 as IEEE half bits) with `value`.
void fill_silence(void* out, int64_t count, mel::DType dtype, float value);

/// Geometry of a batch of files in one arena.
struct BatchLayout {
  /// Long segments stored per file (L).
  int num_long = 0;
  /// Short segments per long segment (S).
  int num_short = 0;
  /// Long and short segment lengths, samples.
  int64_t long_samples = 0;
  int64_t short_samples = 0;
};

/// Spectrograms of a batch of files decoded into `arena`: file i starts at arena[arena_offsets[i]] and holds
/// num_valid_long[i] long segments. Writes [files][L][S][n_mels][n_frames] elements of the engine's dtype to
/// `out`; long segments l >= num_valid_long[i] hold `silence` (mel::silence_value). `scratch` is reused between
/// calls. The engine sees one compute() call with every valid short segment of the batch.
void compute_files(mel::MelEngine& engine, const float* arena, std::span<const int64_t> arena_offsets,
                   std::span<const int> num_valid_long, const BatchLayout& layout, mel::DType dtype, float silence,
                   void* out, std::vector<uint8_t>& scratch);

/// The features of one file as a dataset built with these parameters stores them.
struct FileFeatures {
  /// [num_long][num_short][n_mels][n_frames] elements of `dtype` (float16 as half bits), as raw bytes.
  std::vector<uint8_t> bytes;
  /// Long segments that hold audio, in [1, num_long].
  int num_valid_long = 0;
};

/// Probe, plan, decode and spectrograms of one file with an engine built for segments of
/// segment.short_samples(mel.sample_rate) samples and `dtype`. `num_long` is the dataset's. Throws AudioError
/// naming the file when it cannot be read or is skipped by the plan (too short).
FileFeatures featurize_file(const std::filesystem::path& path, mel::MelEngine& engine, const mel::MelArgs& mel,
                            const segment::SegmentArgs& segment, int channel, int num_long, mel::DType dtype);

/// The parameters of a dataset a Featurizer reproduces: the spectrogram and segmentation parameters, and the
/// geometry the dataset's attributes state (checked against what the parameters give).
struct DatasetParams {
  mel::MelArgs mel;
  /// Segmentation; num_long is ignored (`num_long` below is the dataset's).
  segment::SegmentArgs segment;
  /// Stored element type.
  mel::DType dtype = mel::DType::float32;
  /// Input channel, -1 for a mix to mono.
  int channel = -1;
  /// L, S, M, T and the segment lengths in samples, as the dataset's attributes say.
  int64_t num_long = 0;
  int64_t num_short = 0;
  int64_t n_mels = 0;
  int64_t n_frames = 0;
  int64_t long_samples = 0;
  int64_t short_samples = 0;
};

/// One file's features as float32: [num_long * num_short * n_mels * n_frames] values (float16 datasets: the
/// stored half values, widened exactly), and the valid long segments.
struct FloatFeatures {
  std::vector<float> values;
  int num_valid_long = 0;
};

/// Widens out.size() elements of `dtype` at `bytes` (float16 as half bits, converted exactly) to float32 `out`.
void to_float(const void* bytes, mel::DType dtype, std::span<float> out);

/// featurize_file with one CPU engine built once for many files, as `melforge-train predict` and melforge.predict
/// featurize: the same bytes a dataset with these parameters stores, as float32.
class Featurizer {
 public:
  /// Builds the CPU engine with `threads` threads (0: all cores). Throws FormatError when `params` holds
  /// parameters the kernels refuse or that do not give its n_mels / n_frames / num_short / segment lengths.
  Featurizer(const DatasetParams& params, int threads);
  /// The features of `path`; throws AudioError naming the file when it cannot be read or is too short under
  /// short_files == skip.
  FloatFeatures operator()(const std::filesystem::path& path);
  /// The dataset parameters.
  const DatasetParams& params() const { return params_; }
  /// The CPU engine (kernels/windows computes whole-file windows with it).
  mel::MelEngine& engine() { return *engine_; }

 private:
  DatasetParams params_;
  std::unique_ptr<mel::MelEngine> engine_;
};

}  // namespace melforge::featurize
