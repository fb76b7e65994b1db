#pragma once
/// The options of every view (issue 28), one struct with one registration, as the other option groups.
#include <cstdint>
#include <iosfwd>
#include <string>

namespace boost::program_options {
class options_description;
}

namespace melforge::data::views {

struct FrameRate;

/// What a crop does with a clip shorter than the crop.
enum class ShortClips {
  /// One example of the crop's length: the clip, then padding (masked).
  pad,
  /// One example of the crop's length whose frames repeat the clip from its start (all real).
  repeat,
};
std::string to_string(ShortClips s);
/// "pad" or "repeat"; throws InvalidArgument naming --short-clips otherwise.
ShortClips parse_short_clips(const std::string& s);
std::istream& operator>>(std::istream& in, ShortClips& s);
std::ostream& operator<<(std::ostream& out, ShortClips s);

/// The view options. Field names are the flag names with underscores. Every field is checked by validate(), whichever
/// view is chosen, so a bad value is refused even when the chosen view would not read it.
struct ViewOptions {
  /// The view (`--view`): tiles, crops or clips (view_list()).
  std::string view = "tiles";
  /// Tile length, seconds (> 0).
  double tile_seconds = 2.0;
  /// Distance between tile starts, seconds, in (0, tile_seconds]; 0 means tile_seconds (tiles side by side).
  double tile_hop = 0.0;
  /// A tile with fewer than min_real * tile frames of the clip (a fraction in [0, 1]) is not made, unless it is the
  /// clip's only tile. Kept when real / tile >= min_real.
  double min_real = 0.5;
  /// Crop length, seconds (> 0).
  double crop_seconds = 2.0;
  /// Crops of clips shorter than crop_seconds: padded or repeated.
  ShortClips short_clips = ShortClips::pad;
  /// Crops of a split with augmented copies (aug_copy): the probability, in [0, 1], that a group's crop of an epoch
  /// comes from one of its augmented copies (uniformly) rather than its clean row (as WeSpeaker's aug_prob).
  double aug_prob = 0.6;
  /// Padded frames a batch of whole clips may hold (clips x its longest clip), as seconds of frames (> 0). A clip
  /// longer than this is alone in its batch.
  double clip_batch_seconds = 128.0;

  /// Effective tile hop, seconds: tile_hop, or tile_seconds when tile_hop is 0.
  double hop_seconds() const { return tile_hop > 0 ? tile_hop : tile_seconds; }

  /// Throws InvalidArgument naming the flag for a value out of range (a non-finite or non-positive length, a hop
  /// above the tile, min_real or aug_prob outside [0, 1], an unknown view).
  void validate() const;
  /// validate(), the rate's own check, then: every length must be at least one frame at `rate` (FrameRate::frames)
  /// and below 2^31 frames; throws InvalidArgument naming the flag and the rate otherwise.
  void validate(const FrameRate& rate) const;
};

/// Registers --view, --tile-seconds, --tile-hop, --min-real, --crop-seconds, --short-clips, --aug-prob and
/// --clip-batch-seconds.
void add_options(boost::program_options::options_description& desc, ViewOptions& options);

}  // namespace melforge::data::views
