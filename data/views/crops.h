#pragma once
/// The crops view's draw, for a reader that plans one clip at a time and for tests: counter-based, so a crop is a
/// function of (seed, epoch, clip) alone, with no state carried from clip to clip or epoch to epoch.
#include <cstdint>
#include <span>
#include <string>

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

/// The copy a group of copies trains on in epoch `epoch`: 0 (the clean row) with probability 1 - `aug_prob`, else
/// augmented copy k uniform in [1, `copies`]. `copies` >= 0 (0: always 0), aug_prob in [0, 1]. Drawn from a
/// SplitMix64 stream seeded with splitmix64(crop_key(seed, epoch, group_first) ^ a constant naming the copies'
/// stream), `group_first` being the group's clean row: its first draw u = (draw >> 11) / 2^53 in [0, 1) picks an
/// augmented copy when u < aug_prob, its next unbiased draw below `copies` picks which. Independent of the crop's
/// own draw, so a group of one row crops exactly as crop_example.
int64_t group_copy(int64_t copies, double aug_prob, uint64_t seed, int64_t epoch, int64_t group_first);

/// The crop of the group of copies of clips [first, first + frames.size()) (`frames`: their frame counts, each >= 1;
/// a clean row, then its augmented copies): crop_example of the row group_copy picks (seed, epoch, group = `first`).
/// A group of one row: exactly crop_example(first, ...).
Example group_crop(int64_t first, std::span<const int64_t> frames, int64_t crop, ShortClips short_clips,
                   double aug_prob, uint64_t seed, int64_t epoch);

/// The log line of the crops of a split with groups of copies (`group_offsets` [groups + 1], SplitInfo::
/// group_offsets): "crops: N utterances, K copies each, aug-prob P" (K: augmented copies per group; "K1 to K2
/// copies each" when the groups differ), P as %g.
std::string crops_summary(std::span<const int64_t> group_offsets, double aug_prob);

}  // namespace melforge::data::views
