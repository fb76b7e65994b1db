#pragma once
/// The order in which SegmentLoader delivers a split's valid short segments in one epoch: a chunk-aware shuffle.
///
/// The files are grouped into blocks of one HDF5 chunk each (files_per_chunk files; chunks hold whole files). With
/// shuffle, the blocks are permuted, consecutive permuted blocks form pools of `pool_chunks` blocks, and the
/// segments are permuted within each pool; without, blocks, pools and segments keep the file order. Each pool is
/// read with one aligned read per block, so every chunk is inflated once per epoch, instead of once per segment as
/// a uniformly random order does (each random segment would inflate its whole chunk).
///
/// What this gives up against a uniform permutation: two segments of one epoch can only be neighbours in the order
/// when their chunks fall in the same pool, so a batch draws from at most pool_chunks chunks (pool_chunks *
/// files_per_chunk files), and files that the builder stored next to each other (one chunk) arrive in the same pool.
/// Across epochs the pools are re-drawn. The order depends only on (seed, epoch, shuffle, pool_chunks) and the
/// split's layout, never on the prefetch depth, the batch size or what happened before.
#include <cstdint>
#include <vector>

namespace melforge::data {

/// One epoch's order.
struct ShufflePlan {
  /// Valid-segment positions in delivery order, a permutation of [0, N).
  std::vector<int64_t> order;
  /// Where each pool starts in `order`, then N: [pools + 1].
  std::vector<int64_t> bounds;
  /// The chunk blocks of each pool, in read order (block b holds files [b * files_per_chunk, (b + 1) *
  /// files_per_chunk), the last one possibly fewer).
  std::vector<std::vector<int64_t>> pools;
  /// Row of order[i] in its pool's buffer, [N]: the pool's files are laid out in read order as
  /// [files * num_long * num_short, n_mels, n_frames].
  std::vector<int64_t> rows;
};

/// The plan of epoch `epoch`. `offsets` is SplitInfo::segment_offsets() ([files + 1]), `num_long`/`num_short` the
/// split's L and S, `files_per_chunk` >= 1, `pool_chunks` >= 1. The random draws come from a SplitMix64 stream
/// seeded with a mix of (seed, epoch).
ShufflePlan plan_epoch(const std::vector<int64_t>& offsets, int64_t num_long, int64_t num_short,
                       int64_t files_per_chunk, int64_t pool_chunks, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace melforge::data
