#include "loader/shuffle_plan.h"

#include <algorithm>
#include <numeric>

#include "melforge/common/splitmix.h"

namespace melforge::data {

namespace {

using Rng = SplitMixRng;

/// The stream of epoch `epoch` under `seed`.
Rng epoch_rng(uint64_t seed, int64_t epoch) { return Rng(seed ^ splitmix64(static_cast<uint64_t>(epoch))); }

/// Fisher-Yates shuffle of `v` with draws from `rng`.
void shuffle_in_place(std::vector<int64_t>& v, Rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

void shuffle_epoch(std::vector<int64_t>& v, uint64_t seed, int64_t epoch) {
  Rng rng = epoch_rng(seed, epoch);
  shuffle_in_place(v, rng);
}

ShufflePlan plan_epoch(const std::vector<int64_t>& block_clips, const std::vector<int64_t>& example_offsets,
                       const std::vector<int64_t>& frame_offset, int64_t pool_chunks, bool shuffle, uint64_t seed,
                       int64_t epoch) {
  Rng rng = epoch_rng(seed, epoch);
  const auto blocks = static_cast<int64_t>(block_clips.size()) - 1;
  std::vector<int64_t> block_order(static_cast<std::size_t>(blocks));
  std::iota(block_order.begin(), block_order.end(), 0);
  if (shuffle) shuffle_in_place(block_order, rng);
  ShufflePlan p;
  p.order.reserve(static_cast<std::size_t>(example_offsets.back()));
  p.base.reserve(static_cast<std::size_t>(example_offsets.back()));
  std::vector<int64_t> pick;
  for (int64_t w0 = 0; w0 < blocks; w0 += pool_chunks) {
    std::vector<int64_t> pool(block_order.begin() + w0, block_order.begin() + std::min(w0 + pool_chunks, blocks));
    const auto start = static_cast<int64_t>(p.order.size());
    int64_t pool_frames = 0;
    for (const int64_t b : pool) {
      const auto c0 = static_cast<std::size_t>(block_clips[static_cast<std::size_t>(b)]);
      const auto c1 = static_cast<std::size_t>(block_clips[static_cast<std::size_t>(b) + 1]);
      for (std::size_t c = c0; c < c1; ++c)
        for (int64_t e = example_offsets[c]; e < example_offsets[c + 1]; ++e) {
          p.order.push_back(e);
          p.base.push_back(pool_frames + frame_offset[c] - frame_offset[c0]);
        }
      pool_frames += frame_offset[c1] - frame_offset[c0];
    }
    if (shuffle) {
      pick.resize(p.order.size() - static_cast<std::size_t>(start));
      std::iota(pick.begin(), pick.end(), start);
      shuffle_in_place(pick, rng);
      std::vector<int64_t> order(pick.size()), base(pick.size());
      for (std::size_t i = 0; i < pick.size(); ++i) {
        order[i] = p.order[static_cast<std::size_t>(pick[i])];
        base[i] = p.base[static_cast<std::size_t>(pick[i])];
      }
      std::copy(order.begin(), order.end(), p.order.begin() + start);
      std::copy(base.begin(), base.end(), p.base.begin() + start);
    }
    p.bounds.push_back(start);
    p.pools.push_back(std::move(pool));
  }
  p.bounds.push_back(static_cast<int64_t>(p.order.size()));
  return p;
}

}  // namespace melforge::data
