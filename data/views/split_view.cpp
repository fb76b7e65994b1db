#include "views/split_view.h"

#include <string>

#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge::data::views {

FrameRate split_frame_rate(const SplitInfo& split) {
  return {.sample_rate = split.info.sample_rate, .hop_length = split.info.hop_length};
}

std::unique_ptr<View> make_split_view(const SplitInfo& split, ViewOptions options, bool default_tile, bool evaluation) {
  if (evaluation) options.min_real = 0.0;
  const FrameRate rate = split_frame_rate(split);
  const int64_t n_frames = split.info.n_frames;
  if (split.schema_version < kClipSchemaVersion) {
    if (options.view != "tiles" || !default_tile || options.tile_hop > 0)
      throw InvalidArgument(split.path.string() + " is a schema " + std::to_string(split.schema_version) +
                            " dataset (segments of " + std::to_string(n_frames) +
                            " frames): it is read as tiles of exactly those segments; --view " + options.view +
                            (default_tile ? "" : ", --tile-seconds") + (options.tile_hop > 0 ? ", --tile-hop" : "") +
                            " need a schema 3 dataset (rebuild it with this melforge-build)");
    return make_tiles_view_frames(n_frames, n_frames, 0.0);
  }
  if (default_tile) options.tile_seconds = split.info.short_seconds;
  options.validate(rate);
  if (options.view == "tiles" && default_tile)
    return make_tiles_view_frames(n_frames, options.tile_hop > 0 ? rate.frames(options.tile_hop) : n_frames,
                                  options.min_real);
  return make_view(options, rate);
}

float pad_value(const SplitInfo& split) { return mel::silence_value(split.info.mel_args()); }

}  // namespace melforge::data::views
