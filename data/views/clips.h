#pragma once
/// Batches of whole clips (the clips view's examples, or any examples) of similar length under a frame budget, for
/// evaluation, predict and embed: few padded frames per batch, every example in exactly one batch.
#include <cstdint>
#include <span>
#include <vector>

#include "views/view.h"

namespace melforge::data::views {

/// One batch: examples padded to its longest one (source_frames / frame_mask with padded_length = length).
struct ClipBatch {
  /// Indices into the examples given to batch_by_length, by ascending length (ties by index).
  std::vector<int64_t> members;
  /// Frames every row of the batch is padded to: the longest member's length.
  int64_t length = 0;

  bool operator==(const ClipBatch&) const = default;
};

/// Batches of `examples` with members.size() * length <= `frame_budget` padded frames (>= 1): the examples sorted by
/// length (stable), then cut greedily, a batch closed when the next example would break the budget. An example longer
/// than the budget is alone in its batch; none is dropped. Batches come by ascending length; deterministic. Throws
/// InvalidArgument for a budget below 1. The budget from options: FrameRate::frames(clip_batch_seconds).
std::vector<ClipBatch> batch_by_length(std::span<const Example> examples, int64_t frame_budget);

}  // namespace melforge::data::views
