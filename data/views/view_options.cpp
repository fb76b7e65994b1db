#include "views/view_options.h"

#include <boost/program_options.hpp>

#include <cmath>
#include <istream>
#include <ostream>

#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "views/view.h"

namespace po = boost::program_options;

namespace melforge::data::views {

namespace {

/// Throws InvalidArgument naming `flag` unless `seconds` is finite and > 0.
void require_positive_seconds(double seconds, const std::string& flag) {
  if (!std::isfinite(seconds) || !(seconds > 0))
    throw InvalidArgument(flag + " must be a positive number of seconds, got " + default_text(seconds));
}

/// Throws InvalidArgument naming `flag` unless `seconds` is at least one frame and below 2^31 frames at `rate`.
void require_frames(double seconds, const std::string& flag, const FrameRate& rate) {
  const std::string at = " at " + std::to_string(rate.sample_rate) + " Hz with hop " +
                         std::to_string(rate.hop_length) + " samples";
  if (!(seconds * static_cast<double>(rate.sample_rate) / static_cast<double>(rate.hop_length) < 0x1p31))
    throw InvalidArgument(flag + " " + default_text(seconds) + " is 2^31 frames or more" + at);
  if (rate.frames(seconds) < 1)
    throw InvalidArgument(flag + " " + default_text(seconds) + " is less than one frame" + at);
}

}  // namespace

std::string to_string(ShortClips s) { return s == ShortClips::pad ? "pad" : "repeat"; }

ShortClips parse_short_clips(const std::string& s) {
  if (s == "pad") return ShortClips::pad;
  if (s == "repeat") return ShortClips::repeat;
  throw InvalidArgument("--short-clips: '" + s + "' is not one of pad, repeat");
}

std::istream& operator>>(std::istream& in, ShortClips& s) {
  std::string word;
  in >> word;
  s = parse_short_clips(word);
  return in;
}

std::ostream& operator<<(std::ostream& out, ShortClips s) { return out << to_string(s); }

void ViewOptions::validate() const {
  bool known = false;
  for (const ViewEntry& entry : view_list()) known = known || entry.name == view;
  if (!known) throw InvalidArgument("--view: '" + view + "' is not one of " + view_names());
  require_positive_seconds(tile_seconds, "--tile-seconds");
  if (!std::isfinite(tile_hop) || tile_hop < 0)
    throw InvalidArgument("--tile-hop must be >= 0 seconds (0: --tile-seconds), got " + default_text(tile_hop));
  if (tile_hop > tile_seconds)
    throw InvalidArgument("--tile-hop " + default_text(tile_hop) + " exceeds --tile-seconds " +
                          default_text(tile_seconds) + ": frames between tiles would be read by none");
  if (!(min_real >= 0 && min_real <= 1))
    throw InvalidArgument("--min-real must be a fraction of a tile in [0, 1], got " + default_text(min_real));
  require_positive_seconds(crop_seconds, "--crop-seconds");
  if (!(aug_prob >= 0 && aug_prob <= 1))
    throw InvalidArgument("--aug-prob must be a probability in [0, 1], got " + default_text(aug_prob));
  require_positive_seconds(clip_batch_seconds, "--clip-batch-seconds");
}

void ViewOptions::validate(const FrameRate& rate) const {
  validate();
  rate.validate();
  require_frames(tile_seconds, "--tile-seconds", rate);
  require_frames(hop_seconds(), "--tile-hop", rate);
  require_frames(crop_seconds, "--crop-seconds", rate);
  require_frames(clip_batch_seconds, "--clip-batch-seconds", rate);
}

void add_options(po::options_description& desc, ViewOptions& options) {
  desc.add_options()
    ("view", po::value<std::string>(&options.view)->default_value(options.view),
     ("how clips are read as examples: " + view_names() + " (tiles: fixed windows; crops: one random window per "
      "clip per epoch; clips: whole clips)").c_str())
    ("tile-seconds", po::value<double>(&options.tile_seconds)->default_value(options.tile_seconds, "short_seconds"),
     "tiles: window length, seconds (default: the dataset's short_seconds attribute, the builder's --short-seconds; "
     "a schema 1 or 2 dataset: its short segment)")
    ("tile-hop", po::value<double>(&options.tile_hop)->default_value(options.tile_hop, default_text(options.tile_hop)),
     "tiles: distance between window starts, seconds, at most --tile-seconds (0: --tile-seconds)")
    ("min-real", po::value<double>(&options.min_real)->default_value(options.min_real,
                                                                    default_text(options.min_real)),
     "tiles: a window with fewer real frames than this fraction of it is not made, unless it is the clip's only one")
    ("crop-seconds", po::value<double>(&options.crop_seconds)->default_value(options.crop_seconds,
                                                                            default_text(options.crop_seconds)),
     "crops: window length, seconds")
    ("short-clips", po::value<ShortClips>(&options.short_clips)->default_value(options.short_clips),
     "crops: a clip shorter than the crop is padded (pad, masked) or repeated (repeat)")
    ("aug-prob", po::value<double>(&options.aug_prob)->default_value(options.aug_prob, default_text(options.aug_prob)),
     "crops of a dataset built with --augment-copies: one crop per utterance per epoch, from one of its augmented "
     "copies (uniformly) with this probability, else from its clean copy")
    ("clip-batch-seconds", po::value<double>(&options.clip_batch_seconds)
         ->default_value(options.clip_batch_seconds, default_text(options.clip_batch_seconds)),
     "clips: padded frames per batch of whole clips, seconds (a longer clip is alone in its batch)");
}

}  // namespace melforge::data::views
