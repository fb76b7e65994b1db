#pragma once
/// The crops view's draw, for a reader that plans one clip at a time and for tests: counter-based, so a crop is a
/// function of (seed, epoch, clip) alone, with no state carried from clip to clip or epoch to epoch.
#include <cstdint>

#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

/// The 64-bit key of clip `clip`'s crop in epoch `epoch` under `seed`: SplitMix64 applied three times, mixing in the
/// seed (xor a constant naming the crops' stream), the epoch, then the clip index. The crop's start is the first
/// unbiased draw below (clip_frames - crop + 1) of a SplitMix64 stream seeded with this key.
uint64_t crop_key(uint64_t seed, int64_t epoch, int64_t clip);

/// The crop of `crop` frames (>= 1) of clip `clip` of `clip_frames` frames (>= 1): a clip at least `crop` long gets a
/// start uniform over [0, clip_frames - crop], all real; a shorter one starts at 0 and is padded (real = clip_frames)
/// or, with ShortClips::repeat, repeated (real = crop, repeat = true).
Example crop_example(int64_t clip, int64_t clip_frames, int64_t crop, ShortClips short_clips, uint64_t seed,
                     int64_t epoch);

}  // namespace melforge::data::views
