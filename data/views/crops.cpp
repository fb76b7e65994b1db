// The crops view: one window of --crop-seconds per clip per epoch at a uniformly random start, as speaker and tagging
// recipes train; a shorter clip padded or repeated (--short-clips).
#include <memory>

#include "melforge/common/splitmix.h"
#include "views/crops.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

namespace {

/// Tells the crops' draws apart from other SplitMix64 streams of the same seed (the shuffle's): "crops" in ASCII.
constexpr uint64_t kCropStream = 0x63726f7073ULL;

/// One crop of `crop` frames per clip (see crop_example).
class CropsView final : public View {
 public:
  CropsView(int64_t crop, ShortClips short_clips) : crop_(crop), short_clips_(short_clips) {}

  std::string_view name() const override { return "crops"; }

  bool varies_by_epoch() const override { return true; }

  void clip_examples(int64_t clip, int64_t clip_frames, uint64_t seed, int64_t epoch,
                     std::vector<Example>& out) const override {
    out.push_back(crop_example(clip, clip_frames, crop_, short_clips_, seed, epoch));
  }

 private:
  int64_t crop_;
  ShortClips short_clips_;
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

/// The crops view of `options` at `rate` (options validated by make_view).
std::unique_ptr<View> make_crops_view(const ViewOptions& options, const FrameRate& rate) {
  return std::make_unique<CropsView>(rate.frames(options.crop_seconds), options.short_clips);
}

}  // namespace melforge::data::views
