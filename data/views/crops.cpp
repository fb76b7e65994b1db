// The crops view: one window of --crop-seconds per clip per epoch at a uniformly random start, as speaker and tagging
// recipes train; a shorter clip padded or repeated (--short-clips). A split with augmented copies (aug_copy) gives one
// crop per group of copies per epoch, from the clean row or, with probability --aug-prob, one of its copies.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "melforge/common/errors.h"

#include "melforge/common/splitmix.h"
#include "views/crops.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

namespace {

/// Tells the crops' draws apart from other SplitMix64 streams of the same seed (the shuffle's): "crops" in ASCII.
constexpr uint64_t kCropStream = 0x63726f7073ULL;
/// Tells the copy choice's draws apart from the crop start's: "copies" in ASCII.
constexpr uint64_t kCopyStream = 0x636f70696573ULL;

/// One crop of `crop` frames per clip (see crop_example), or per group of copies (group_crop).
class CropsView final : public View {
 public:
  CropsView(int64_t crop, ShortClips short_clips, double aug_prob)
      : crop_(crop), short_clips_(short_clips), aug_prob_(aug_prob) {}

  std::string_view name() const override { return "crops"; }

  bool varies_by_epoch() const override { return true; }

  void clip_examples(int64_t clip, int64_t clip_frames, uint64_t seed, int64_t epoch,
                     std::vector<Example>& out) const override {
    out.push_back(crop_example(clip, clip_frames, crop_, short_clips_, seed, epoch));
  }

  void group_examples(int64_t first, int64_t rows, std::span<const int64_t> clip_frames, uint64_t seed,
                      int64_t epoch, std::vector<Example>& out) const override {
    const std::span<const int64_t> group =
        clip_frames.subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(rows));
    out.push_back(group_crop(first, group, crop_, short_clips_, aug_prob_, seed, epoch));
  }

 private:
  int64_t crop_;
  ShortClips short_clips_;
  double aug_prob_;
};

}  // namespace

uint64_t crop_key(uint64_t seed, int64_t epoch, int64_t clip) {
  const uint64_t s = splitmix64(seed ^ kCropStream);
  const uint64_t e = splitmix64(s ^ static_cast<uint64_t>(epoch));
  return splitmix64(e ^ static_cast<uint64_t>(clip));
}

Example crop_example(int64_t clip, int64_t clip_frames, int64_t crop, ShortClips short_clips, uint64_t seed,
                     int64_t epoch) {
  Example e{.clip = clip, .start = 0, .length = crop, .real = crop, .clip_frames = clip_frames};
  if (clip_frames >= crop) {
    SplitMixRng rng(crop_key(seed, epoch, clip));
    e.start = static_cast<int64_t>(rng.below(static_cast<uint64_t>(clip_frames - crop + 1)));
  } else if (short_clips == ShortClips::repeat) {
    e.repeat = true;
  } else {
    e.real = clip_frames;
  }
  return e;
}

int64_t group_copy(int64_t copies, double aug_prob, uint64_t seed, int64_t epoch, int64_t group_first) {
  if (copies < 0) throw InvalidArgument("group_copy: copies must be >= 0, got " + std::to_string(copies));
  if (!(aug_prob >= 0 && aug_prob <= 1))
    throw InvalidArgument("group_copy: aug_prob must be in [0, 1], got " + std::to_string(aug_prob));
  if (copies == 0) return 0;
  SplitMixRng rng(splitmix64(crop_key(seed, epoch, group_first) ^ kCopyStream));
  const double u = static_cast<double>(rng.next() >> 11) * 0x1p-53;
  if (!(u < aug_prob)) return 0;
  return 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(copies)));
}

Example group_crop(int64_t first, std::span<const int64_t> frames, int64_t crop, ShortClips short_clips,
                   double aug_prob, uint64_t seed, int64_t epoch) {
  if (frames.empty()) throw InvalidArgument("group_crop: a group of copies holds at least its clean row");
  const int64_t k = group_copy(static_cast<int64_t>(frames.size()) - 1, aug_prob, seed, epoch, first);
  return crop_example(first + k, frames[static_cast<std::size_t>(k)], crop, short_clips, seed, epoch);
}

std::string crops_summary(std::span<const int64_t> group_offsets, double aug_prob) {
  int64_t least = 0, most = 0;
  for (std::size_t g = 0; g + 1 < group_offsets.size(); ++g) {
    const int64_t copies = group_offsets[g + 1] - group_offsets[g] - 1;
    least = g == 0 ? copies : std::min(least, copies);
    most = std::max(most, copies);
  }
  const int64_t groups = group_offsets.empty() ? 0 : static_cast<int64_t>(group_offsets.size()) - 1;
  char p[32];
  std::snprintf(p, sizeof p, "%g", aug_prob);
  return "crops: " + std::to_string(groups) + " utterances, " +
         (least == most ? std::to_string(most) : std::to_string(least) + " to " + std::to_string(most)) +
         " copies each, aug-prob " + p;
}

/// The crops view of `options` at `rate` (options validated by make_view).
std::unique_ptr<View> make_crops_view(const ViewOptions& options, const FrameRate& rate) {
  return std::make_unique<CropsView>(rate.frames(options.crop_seconds), options.short_clips, options.aug_prob);
}

}  // namespace melforge::data::views
