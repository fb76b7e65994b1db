// The list of views: a new view is a file defining its factory (e.g. tiles.cpp's make_tiles_view) and a line here.
#include <memory>

#include "melforge/common/errors.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

std::unique_ptr<View> make_tiles_view(const ViewOptions& options, const FrameRate& rate);
std::unique_ptr<View> make_crops_view(const ViewOptions& options, const FrameRate& rate);
std::unique_ptr<View> make_clips_view(const ViewOptions& options, const FrameRate& rate);

namespace {

constexpr ViewEntry kViews[] = {
    {"tiles", "windows of --tile-seconds every --tile-hop over each clip, the last one padded", make_tiles_view},
    {"crops", "one window of --crop-seconds per clip per epoch at a seeded random start", make_crops_view},
    {"clips", "whole clips, batched by similar length", make_clips_view},
};

}  // namespace

std::span<const ViewEntry> view_list() { return kViews; }

std::string view_names() {
  std::string names;
  for (const ViewEntry& entry : kViews) names += (names.empty() ? "" : ", ") + std::string(entry.name);
  return names;
}

std::unique_ptr<View> make_view(const ViewOptions& options, const FrameRate& rate) {
  options.validate(rate);
  for (const ViewEntry& entry : kViews)
    if (entry.name == options.view) return entry.make(options, rate);
  throw InvalidArgument("--view: '" + options.view + "' is not one of " + view_names());
}

}  // namespace melforge::data::views
