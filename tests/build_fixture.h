#pragma once
// A small synthetic corpus written with libsndfile, for end-to-end builder tests.
#include <sndfile.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "mel/mel_engine.h"
#include "melforge/common/h5.h"
#include "h5_writer.h"
#include "merge.h"
#include "pipeline.h"

namespace melforge::test {

/// Writes mono `samples` (float, full scale 1) at `rate` Hz to `path` as WAV of `format` (float32 by default).
inline void write_samples(const std::filesystem::path& path, const std::vector<float>& samples, int rate,
                          int format = SF_FORMAT_WAV | SF_FORMAT_FLOAT) {
  std::filesystem::create_directories(path.parent_path());
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = 1;
  info.format = format;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  if (!f) throw std::runtime_error("cannot write " + path.string() + ": " + sf_strerror(nullptr));
  sf_writef_float(f, samples.data(), static_cast<sf_count_t>(samples.size()));
  sf_close(f);
}

/// Writes a mono or multi-channel 16-bit WAV (or `format`) of `frames` frames: a sine of `hz` with a little
/// deterministic noise, the same on every channel.
inline void write_tone(const std::filesystem::path& path, double hz, int64_t frames, int rate, int channels = 1,
                       int format = SF_FORMAT_WAV | SF_FORMAT_PCM_16, float nan_at = -1) {
  std::filesystem::create_directories(path.parent_path());
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = format;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  if (!f) throw std::runtime_error("cannot write " + path.string() + ": " + sf_strerror(nullptr));
  std::vector<float> buf(static_cast<std::size_t>(frames * channels));
  uint32_t lcg = 12345u + static_cast<uint32_t>(hz);
  for (int64_t i = 0; i < frames; ++i) {
    lcg = lcg * 1664525u + 1013904223u;
    const float noise = (static_cast<float>(lcg >> 8) / 16777216.0f - 0.5f) * 0.02f;
    const float v = 0.5f * static_cast<float>(std::sin(2.0 * M_PI * hz * static_cast<double>(i) / rate)) + noise;
    for (int c = 0; c < channels; ++c) buf[static_cast<std::size_t>(i * channels + c)] = v;
  }
  if (nan_at >= 0) buf[static_cast<std::size_t>(nan_at)] = NAN;
  sf_writef_float(f, buf.data(), frames);
  sf_close(f);
}

/// A corpus of `classes` classes (tones at different pitches), `per_class` files each, lengths varying between
/// 0.6 and 2.6 long segments of 1 s at 8 kHz, plus a stereo 16 kHz file per class (resampled and mixed down).
inline int write_tone_corpus(const std::filesystem::path& root, int classes, int per_class) {
  int n = 0;
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      const int64_t frames = 4800 + (i * 3137 + c * 911) % 16000;
      write_tone(root / ("class" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"), 300.0 * (c + 1) + 7 * i,
                 frames, 8000);
      ++n;
    }
    write_tone(root / ("class" + std::to_string(c)) / "stereo16k.wav", 300.0 * (c + 1), 24000, 16000, 2);
    ++n;
  }
  return n;
}

/// A CPU build of a tone corpus at `in` into `out`: 8 kHz, n_fft 256, hop 64, 32 mels, whole clips, a default tile
/// of 0.25 s, split 0.6/0.2/0.2, quiet.
inline builder::BuildConfig tone_build_config(const std::filesystem::path& in, const std::filesystem::path& out) {
  builder::BuildConfig c;
  c.build.input = in;
  c.build.output = out;
  c.build.quiet = true;
  c.build.device = mel::Device::cpu;
  c.build.split = "0.6,0.2,0.2";
  c.mel.sample_rate = 8000;
  c.mel.n_fft = 256;
  c.mel.win_length = 256;
  c.mel.hop_length = 64;
  c.mel.n_mels = 32;
  c.clips.short_seconds = 0.25;
  return c;
}

/// Everything a schema-3 split file holds, read through melforge::h5 (frames as float32).
struct SplitData {
  /// frames [N, M], row-major.
  std::vector<float> frames;
  /// [N, M].
  std::vector<int64_t> dims;
  std::vector<int32_t> label;
  /// frame_offset [F + 1], num_samples [F], clip_flags [F] (checked by read_clip_columns).
  builder::ClipColumns clips;
  std::vector<std::string> path;
  std::vector<std::string> classes;
  /// Clips: F.
  std::size_t files() const { return label.size(); }
  /// Frames of clip f.
  int64_t clip_frames(std::size_t f) const { return clips.frame_offset[f + 1] - clips.frame_offset[f]; }
  /// The frames of clip f, [clip_frames(f)][M] row-major.
  std::vector<float> clip(std::size_t f) const {
    const auto m = static_cast<std::size_t>(dims[1]);
    return {frames.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(clips.frame_offset[f]) * m),
            frames.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(clips.frame_offset[f + 1]) * m)};
  }
};

/// Reads a split file: frames, label, the clip columns, path and class_names.
inline SplitData read_split(const std::filesystem::path& file) {
  auto f = h5::open_file(file);
  auto ds = h5::open_dataset(f, "frames");
  SplitData d;
  d.dims = h5::dims(ds);
  d.frames = h5::read_float(ds);
  d.label = h5::read_int32(f, "label");
  d.clips = builder::read_clip_columns(f, static_cast<int64_t>(d.label.size()), d.dims.at(0), file.string());
  d.path = h5::read_strings(f, "path");
  d.classes = h5::read_strings(f, "class_names");
  return d;
}

/// Builds `config` as `shards` shards, shard K into `root`/shard-K, and returns the folders in order 1..N.
inline std::vector<std::filesystem::path> build_shards(builder::BuildConfig config, const std::filesystem::path& root,
                                                       int shards) {
  std::vector<std::filesystem::path> dirs;
  for (int k = 1; k <= shards; ++k) {
    config.build.shard = std::to_string(k) + "/" + std::to_string(shards);
    config.build.output = root / ("shard-" + std::to_string(k));
    builder::run_build(config);
    dirs.push_back(config.build.output);
  }
  return dirs;
}

/// Merges the shard folders `dirs` into `out` (virtual datasets, or self-contained with `copy`); returns the report.
inline nlohmann::json merge_shards(const std::vector<std::filesystem::path>& dirs, const std::filesystem::path& out,
                                   bool copy) {
  builder::MergeOptions m;
  m.shards = dirs;
  m.output = out;
  m.copy = copy;
  return builder::run_merge(m);
}

}  // namespace melforge::test
