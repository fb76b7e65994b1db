#pragma once
/// The view a split is read through, with the split's own defaults: one place for the trainer, the Python package and
/// predict to resolve --view against a dataset's schema.
#include <memory>

#include "reader/split_info.h"
#include "views/view.h"
#include "views/view_options.h"

namespace melforge::data::views {

/// The frame rate of `split`'s log-mels (sample_rate, hop_length).
FrameRate split_frame_rate(const SplitInfo& split);

/// The view `options` names for `split`. `default_tile`: the tiles are the split's default tile, ignoring
/// options.tile_seconds (schema 3: n_frames frames, the model input width; its short_seconds). `evaluation` forces
/// min_real 0 (every frame of every clip in a tile). Schema 1/2: only tiles of exactly n_frames frames with hop
/// n_frames and min_real 0 (the stored segments); another view, a tile length or a hop is refused with
/// InvalidArgument naming the schema. Throws InvalidArgument naming the flag for bad options (ViewOptions::validate).
std::unique_ptr<View> make_split_view(const SplitInfo& split, ViewOptions options, bool default_tile, bool evaluation);

/// The value padded frames hold: mel::silence_value of the split's parameters (the log of zero energy).
float pad_value(const SplitInfo& split);

}  // namespace melforge::data::views
