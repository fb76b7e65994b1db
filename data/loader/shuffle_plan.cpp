#include "loader/shuffle_plan.h"

#include <algorithm>
#include <numeric>

#include "melforge/common/splitmix.h"

namespace melforge::data {

namespace {

using Rng = SplitMixRng;

/// Fisher-Yates shuffle of `v` with draws from `rng`.
void shuffle_in_place(std::vector<int64_t>& v, Rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

ShufflePlan plan_epoch(const std::vector<int64_t>& offsets, int64_t num_long, int64_t num_short,
                       int64_t files_per_chunk, int64_t pool_chunks, bool shuffle, uint64_t seed, int64_t epoch) {
  Rng rng(seed ^ splitmix64(static_cast<uint64_t>(epoch)));
  const auto files = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t blocks = (files + files_per_chunk - 1) / files_per_chunk;
  const int64_t segment_rows = num_long * num_short;
  std::vector<int64_t> block_order(static_cast<std::size_t>(blocks));
  std::iota(block_order.begin(), block_order.end(), 0);
  if (shuffle) shuffle_in_place(block_order, rng);
  ShufflePlan p;
  p.order.reserve(static_cast<std::size_t>(offsets.back()));
  p.rows.reserve(static_cast<std::size_t>(offsets.back()));
  std::vector<int64_t> pick;
  for (int64_t w0 = 0; w0 < blocks; w0 += pool_chunks) {
    std::vector<int64_t> pool(block_order.begin() + w0, block_order.begin() + std::min(w0 + pool_chunks, blocks));
    const auto start = static_cast<int64_t>(p.order.size());
    int64_t file_offset = 0;
    for (const int64_t b : pool) {
      const int64_t f0 = b * files_per_chunk, f1 = std::min(files, f0 + files_per_chunk);
      for (int64_t f = f0; f < f1; ++f)
        for (int64_t q = offsets[static_cast<std::size_t>(f)]; q < offsets[static_cast<std::size_t>(f) + 1]; ++q) {
          p.order.push_back(q);
          p.rows.push_back((file_offset + f - f0) * segment_rows + (q - offsets[static_cast<std::size_t>(f)]));
        }
      file_offset += f1 - f0;
    }
    if (shuffle) {
      pick.resize(p.order.size() - static_cast<std::size_t>(start));
      std::iota(pick.begin(), pick.end(), start);
      shuffle_in_place(pick, rng);
      std::vector<int64_t> order(pick.size()), rows(pick.size());
      for (std::size_t i = 0; i < pick.size(); ++i) {
        order[i] = p.order[static_cast<std::size_t>(pick[i])];
        rows[i] = p.rows[static_cast<std::size_t>(pick[i])];
      }
      std::copy(order.begin(), order.end(), p.order.begin() + start);
      std::copy(rows.begin(), rows.end(), p.rows.begin() + start);
    }
    p.bounds.push_back(start);
    p.pools.push_back(std::move(pool));
  }
  p.bounds.push_back(static_cast<int64_t>(p.order.size()));
  return p;
}

}  // namespace melforge::data
