// The tiles view: windows of --tile-seconds every --tile-hop over each clip, the last one padded, the default for
// classification (train, evaluation and predict read a clip the same way).
#include <algorithm>
#include <memory>
#include <string>

#include "melforge/common/errors.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

namespace {

/// Tiles of `tile` frames every `hop` frames (1 <= hop <= tile); a padded last tile is made when its real frames
/// are at least `min_real` of the tile, or when it is the clip's only one.
class TilesView final : public View {
 public:
  TilesView(int64_t tile, int64_t hop, double min_real) : tile_(tile), hop_(hop), min_real_(min_real) {}

  std::string_view name() const override { return "tiles"; }

  void clip_examples(int64_t clip, int64_t clip_frames, uint64_t, int64_t, std::vector<Example>& out) const override {
    for (int64_t start = 0;; start += hop_) {
      const int64_t real = std::min(tile_, clip_frames - start);
      const bool only = start == 0;
      if (only || static_cast<double>(real) / static_cast<double>(tile_) >= min_real_)
        out.push_back({.clip = clip, .start = start, .length = tile_, .real = real, .clip_frames = clip_frames});
      if (start + tile_ >= clip_frames) break;
    }
  }

 private:
  int64_t tile_;
  int64_t hop_;
  double min_real_;
};

}  // namespace

std::unique_ptr<View> make_tiles_view_frames(int64_t tile, int64_t hop, double min_real) {
  if (tile < 1) throw InvalidArgument("tile must be >= 1 frame, got " + std::to_string(tile));
  if (hop < 1 || hop > tile)
    throw InvalidArgument("tile hop must be in [1, tile = " + std::to_string(tile) + "] frames, got " +
                          std::to_string(hop));
  if (!(min_real >= 0.0 && min_real <= 1.0))
    throw InvalidArgument("min_real must be in [0, 1], got " + std::to_string(min_real));
  return std::make_unique<TilesView>(tile, hop, min_real);
}

/// The tiles view of `options` at `rate` (options validated by make_view).
std::unique_ptr<View> make_tiles_view(const ViewOptions& options, const FrameRate& rate) {
  return make_tiles_view_frames(rate.frames(options.tile_seconds), rate.frames(options.hop_seconds()),
                                options.min_real);
}

}  // namespace melforge::data::views
