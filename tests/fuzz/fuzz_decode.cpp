// libFuzzer target: the audio probe, segment plan and decode that melforge-build runs on every input file
// (builder/pipeline.cpp: audio::probe -> audio::output_frames -> segment::plan_file -> audio::decode with
// max_frames = the plan's arena). Input: 4 parameter bytes, then the bytes of the audio file.
//   byte 0: target sample rate (8000, 16000, 22050, 44100); byte 1: channel (-1 mix-down, 0..3);
//   byte 2: segment lengths and --short-files; byte 3: num_long (1..4).
// Findings are crashes, sanitizer reports, and a decode result that breaks the contract the pipeline relies on.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "audio/decode.h"
#include "fuzz_util.h"
#include "melforge/common/errors.h"
#include "segment/segment_args.h"

using melforge::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static melforge::fuzz::MemFile file;
  if (size < 4) return 0;
  static constexpr int kRates[] = {8000, 16000, 22050, 44100};
  static constexpr double kLong[] = {0.1, 0.25, 0.5, 1.0};
  static constexpr double kShort[] = {0.02, 0.05, 0.1, 0.25};
  const int rate = kRates[data[0] & 3];
  melforge::segment::SegmentArgs args;
  args.long_seconds = kLong[data[2] & 3];
  args.short_seconds = std::min(kShort[(data[2] >> 2) & 3], args.long_seconds);
  args.short_files = (data[2] & 16) ? melforge::segment::ShortFilePolicy::skip : melforge::segment::ShortFilePolicy::pad;
  const int num_long = 1 + (data[3] & 3);
  melforge::audio::DecodeOptions opts;
  opts.sample_rate = rate;
  opts.channel = static_cast<int>(data[1] % 5) - 1;
  file.assign(data + 4, size - 4);

  melforge::audio::AudioInfo info;
  try {
    info = melforge::audio::probe(file.path());
  } catch (const melforge::AudioError&) {
    return 0;
  }
  require(info.frames > 0 && info.sample_rate > 0 && info.channels > 0, "probe accepted a header without frames");
  const int64_t frames = melforge::audio::output_frames(info, rate);
  require(frames >= 1, "output_frames < 1 for a non-empty file");

  const melforge::segment::FilePlan plan = melforge::segment::plan_file(frames, args, rate, num_long);
  if (!plan.skip_reason.empty()) return 0;
  const int64_t L = args.long_samples(rate);
  require(plan.num_valid_long >= 1 && plan.num_valid_long <= num_long, "plan: num_valid_long out of [1, num_long]");
  require(plan.arena_samples == plan.num_valid_long * L, "plan: arena is not num_valid_long long segments");
  require(plan.padded_samples >= 0 && plan.dropped_samples >= 0, "plan: negative padding or dropped samples");

  melforge::audio::DecodedAudio audio;
  try {
    audio = melforge::audio::decode(file.path(), opts, plan.arena_samples);
  } catch (const melforge::AudioError&) {
    return 0;
  }
  const auto n = static_cast<int64_t>(audio.samples.size());
  require(n >= 1, "decode returned an empty signal");
  require(n <= plan.arena_samples, "decode returned more than max_frames");
  require(n == std::min(frames, plan.arena_samples),
          "decode returned " + std::to_string(n) + " frames, the plan expected min(" + std::to_string(frames) + ", " +
              std::to_string(plan.arena_samples) + ")");
  for (int64_t i = 0; i < n; ++i)
    require(std::isfinite(audio.samples[static_cast<size_t>(i)]),
            "decode returned a non-finite sample at " + std::to_string(i));
  return 0;
}
