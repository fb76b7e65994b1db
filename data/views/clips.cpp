// The clips view: each clip whole, one example, for evaluation, predict and embed; batch_by_length groups them.
#include "views/clips.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>

#include "melforge/common/errors.h"
#include "views/view_options.h"

namespace melforge::data::views {

namespace {

/// One example per clip, the whole clip, nothing padded.
class ClipsView final : public View {
 public:
  std::string_view name() const override { return "clips"; }

  void clip_examples(int64_t clip, int64_t clip_frames, uint64_t, int64_t, std::vector<Example>& out) const override {
    out.push_back({.clip = clip, .start = 0, .length = clip_frames, .real = clip_frames, .clip_frames = clip_frames});
  }
};

}  // namespace

std::vector<ClipBatch> batch_by_length(std::span<const Example> examples, int64_t frame_budget) {
  if (frame_budget < 1) throw InvalidArgument("clip batch budget must be >= 1 frame, got " +
                                              std::to_string(frame_budget));
  std::vector<int64_t> order(examples.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return examples[static_cast<std::size_t>(a)].length < examples[static_cast<std::size_t>(b)].length;
  });
  std::vector<ClipBatch> batches;
  for (const int64_t i : order) {
    const int64_t length = examples[static_cast<std::size_t>(i)].length;
    const bool fits = !batches.empty() &&
                      static_cast<int64_t>(batches.back().members.size() + 1) * length <= frame_budget;
    if (!fits) batches.emplace_back();
    batches.back().members.push_back(i);
    batches.back().length = length;
  }
  return batches;
}

/// The clips view (it has no option of its own; clip_batch_seconds is the batching's).
std::unique_ptr<View> make_clips_view(const ViewOptions&, const FrameRate&) { return std::make_unique<ClipsView>(); }

}  // namespace melforge::data::views
