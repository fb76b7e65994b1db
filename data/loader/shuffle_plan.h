#pragma once
/// The order in which ExampleLoader delivers a split's examples in one epoch: a chunk-aware shuffle.
///
/// The clips are grouped into blocks, one per HDF5 chunk (ClipReader::chunk_of_clip: the clips whose first frame lies
/// in that chunk; in schema 1/2 a chunk holds whole files). With shuffle, the blocks are permuted, consecutive
/// permuted blocks form pools of `pool_chunks` blocks, and the examples of a pool's clips are permuted within the
/// pool; without, blocks, pools and examples keep the clip order. Each pool is read with one read per block, so
/// every chunk is inflated about once per epoch (a schema-3 clip that runs into the next chunk inflates that one
/// again), instead of once per example as a uniformly random order does.
///
/// What this gives up against a uniform permutation: two examples of one epoch can only be neighbours in the order
/// when their chunks fall in the same pool, so a batch draws from at most pool_chunks chunks, and clips that the
/// builder stored next to each other (one chunk) arrive in the same pool. Across epochs the pools are re-drawn. The
/// order depends only on (seed, epoch, shuffle, pool_chunks), the blocks and the examples per clip, never on the
/// prefetch depth, the batch size or what happened before. For schema 1/2 tiles (one example per valid segment) it
/// is the order the segment loader of earlier versions gave.
#include <cstdint>
#include <vector>

namespace melforge::data {

/// One epoch's order.
struct ShufflePlan {
  /// Example indices (into the epoch's examples, clip by clip) in delivery order, a permutation of [0, E).
  std::vector<int64_t> order;
  /// Where each pool starts in `order`, then E: [pools + 1].
  std::vector<int64_t> bounds;
  /// The blocks of each pool, in read order.
  std::vector<std::vector<int64_t>> pools;
  /// For order[i]: the first frame of its clip in its pool's buffer, [E] (a pool's blocks are read one after the
  /// other, each its clips' frames side by side).
  std::vector<int64_t> base;
};

/// The plan of epoch `epoch`. `block_clips` [blocks + 1] cuts the clips into blocks (block b is clips
/// [block_clips[b], block_clips[b + 1])); `example_offsets` [clips + 1] says where each clip's examples start in the
/// epoch's example list; `frame_offset` [clips + 1] is SplitInfo::frame_offset. pool_chunks >= 1. The random draws
/// come from a SplitMix64 stream seeded with a mix of (seed, epoch).
ShufflePlan plan_epoch(const std::vector<int64_t>& block_clips, const std::vector<int64_t>& example_offsets,
                       const std::vector<int64_t>& frame_offset, int64_t pool_chunks, bool shuffle, uint64_t seed,
                       int64_t epoch);

/// Fisher-Yates shuffle of `v` with draws from a SplitMix64 stream seeded with a mix of (seed, epoch): the order
/// of by-length batches in a shuffled epoch.
void shuffle_epoch(std::vector<int64_t>& v, uint64_t seed, int64_t epoch);

}  // namespace melforge::data
