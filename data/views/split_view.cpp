#include "views/split_view.h"

#include <string>
#include <vector>

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
    std::vector<std::string> asked;
    if (options.view != "tiles") asked.push_back("the view '" + options.view + "' (--view)");
    if (!default_tile) asked.push_back("a tile length (--tile-seconds)");
    if (options.tile_hop > 0) asked.push_back("a tile hop (--tile-hop)");
    if (!asked.empty()) {
      std::string list;
      for (std::size_t i = 0; i < asked.size(); ++i)
        list += (i == 0 ? "" : i + 1 == asked.size() ? " and " : ", ") + asked[i];
      throw InvalidArgument(split.path.string() + " is a schema " + std::to_string(split.schema_version) +
                            " dataset: it is read as tiles of exactly its stored segments (" +
                            std::to_string(n_frames) + " frames); " + list + (asked.size() > 1 ? " need" : " needs") +
                            " a schema 3 dataset (rebuild it with this melforge-build)");
    }
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
