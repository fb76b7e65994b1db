#include "views/view.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "melforge/common/errors.h"

namespace melforge::data::views {

int64_t FrameRate::frames(double seconds) const {
  return std::llround(seconds * static_cast<double>(sample_rate) / static_cast<double>(hop_length));
}

void FrameRate::validate() const {
  if (sample_rate <= 0) throw InvalidArgument("sample rate must be > 0 Hz, got " + std::to_string(sample_rate));
  if (hop_length <= 0) throw InvalidArgument("hop length must be > 0 samples, got " + std::to_string(hop_length));
}

std::vector<int64_t> source_frames(const Example& e, int64_t padded_length) {
  std::vector<int64_t> source(static_cast<std::size_t>(std::max(e.length, padded_length)), -1);
  for (int64_t i = 0; i < e.real; ++i)
    source[static_cast<std::size_t>(i)] = e.repeat ? (e.start + i) % e.clip_frames : e.start + i;
  return source;
}

std::vector<uint8_t> frame_mask(const Example& e, int64_t padded_length) {
  std::vector<uint8_t> mask(static_cast<std::size_t>(std::max(e.length, padded_length)), 0);
  std::fill_n(mask.begin(), e.real, uint8_t{1});
  return mask;
}

void View::group_examples(int64_t first, int64_t rows, std::span<const int64_t> clip_frames, uint64_t seed,
                          int64_t epoch, std::vector<Example>& out) const {
  for (int64_t c = first; c < first + rows; ++c)
    clip_examples(c, clip_frames[static_cast<std::size_t>(c)], seed, epoch, out);
}

namespace {

/// Throws InvalidArgument unless `offsets` is empty or starts at 0, increases strictly and ends at `clips`.
void check_group_offsets(std::span<const int64_t> offsets, std::size_t clips) {
  if (offsets.empty()) return;
  bool ok = offsets.front() == 0 && offsets.back() == static_cast<int64_t>(clips) &&
            (clips == 0) == (offsets.size() == 1);
  for (std::size_t g = 1; ok && g < offsets.size(); ++g) ok = offsets[g] > offsets[g - 1];
  if (!ok)
    throw InvalidArgument("group offsets [" + std::to_string(offsets.size()) + "] must start at 0, increase " +
                          "strictly and end at the " + std::to_string(clips) + " clips");
}

}  // namespace

std::vector<Example> View::examples(std::span<const int64_t> clip_frames, uint64_t seed, int64_t epoch,
                                    std::span<const int64_t> group_offsets) const {
  if (epoch < 0) throw InvalidArgument("epoch must be >= 0, got " + std::to_string(epoch));
  for (std::size_t c = 0; c < clip_frames.size(); ++c)
    if (clip_frames[c] < 1)
      throw InvalidArgument("clip " + std::to_string(c) + " has " + std::to_string(clip_frames[c]) +
                            " frames; a view needs at least 1");
  check_group_offsets(group_offsets, clip_frames.size());
  std::vector<Example> out;
  out.reserve(clip_frames.size());
  if (group_offsets.empty()) {
    for (std::size_t c = 0; c < clip_frames.size(); ++c)
      clip_examples(static_cast<int64_t>(c), clip_frames[c], seed, epoch, out);
    return out;
  }
  for (std::size_t g = 0; g + 1 < group_offsets.size(); ++g)
    group_examples(group_offsets[g], group_offsets[g + 1] - group_offsets[g], clip_frames, seed, epoch, out);
  return out;
}

}  // namespace melforge::data::views
