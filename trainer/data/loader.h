#pragma once
/// Batches of examples from a Split read through a view (data/views: tiles, crops or whole clips): the examples of
/// an epoch in a permutation that depends only on (seed, epoch), gathered by a background thread into a bounded
/// queue (pinned host memory and non-blocking copies when the device is CUDA), or gathered on the device itself
/// when the split's frames fit the --gpu-mem budget. A view whose examples change with the epoch (crops) gives the
/// examples of (seed, epoch) too, so a resumed run sees what an uninterrupted one sees.
///
/// A split held in RAM is shuffled globally. A streamed split (Split::streamed) is shuffled in windows: the clips
/// are grouped into blocks of the consecutive clips that start in one HDF5 chunk (ClipReader::chunk_of_clip), the
/// blocks are permuted,
/// consecutive permuted blocks form windows of at most --stream-window MiB of float32 frames, and the examples of a
/// window's clips are permuted within the window. A window is read with one read per block, the next one on a
/// reader thread while the current one is gathered (during the last window, the first window of the next epoch),
/// so at most three windows are in memory.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "views/view.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

struct Split;

/// Batch sampling settings.
struct LoaderOptions {
  /// Examples per batch, >= 1.
  int64_t batch_size = 64;
  /// Drop the last batch of an epoch when it is smaller than batch_size (default: keep it).
  bool drop_last = false;
  /// Batches the background thread keeps ready, >= 0; 0 gathers each batch on the caller's thread.
  int64_t prefetch = 4;
  /// Device memory budget in MiB for keeping a split resident on a CUDA device (0: never). When the split's frames
  /// fit ((N + 1) * n_mels * 4 bytes), they are copied to the device once and every batch is gathered there from a
  /// [B, T] index of frame rows (any view, crops included).
  int64_t gpu_mem = 0;
  /// Streamed splits: float32 MiB of frames per shuffle window (> 0; at least one HDF5 chunk of files is
  /// always taken). Larger windows shuffle more globally and hold more RAM (up to three windows at once).
  double stream_window = 256;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
  /// Every field, keyed by field name.
  nlohmann::json to_json() const;
  /// Reads to_json()'s fields (missing ones keep their defaults); throws FormatError on a mistyped one.
  static LoaderOptions from_json(const nlohmann::json& j);
};

/// Registers --batch-size --drop-last --prefetch --gpu-mem --stream-window.
void add_options(boost::program_options::options_description& desc, LoaderOptions& opts);

/// One batch.
struct Batch {
  /// Examples, float32 [B, n_mels, T] on the loader's device: each row's real frames first, then the split's pad
  /// value (T: the loader's example length, or the batch's longest example when that is 0).
  at::Tensor x;
  /// Class labels (the clip's label), int64 [B] on the loader's device.
  at::Tensor y;
  /// Real frames of each row, int64 [B] on the loader's device, each in [1, T].
  at::Tensor lengths;
  /// Clip row (in the split) of each row, int64 [B] on the loader's device.
  at::Tensor clip;
  /// Index of the batch within its epoch, 0-based.
  int64_t index = 0;
  /// Samples of the global batch this one is a slice of (all ranks together); B when there is one rank.
  int64_t global_size = 0;
};

/// The batch source of one split. Methods are called from one thread (the training loop); the prefetch thread is
/// internal. The split and the view must outlive the loader.
class BatchLoader {
 public:
  /// Batches of the examples `view` cuts from `split` (its frames loaded on the CPU, or streamed), each padded to
  /// `example_length` frames (>= every example's length; 0: each batch's longest example). `seed` fixes every
  /// epoch's order and examples; `device` is where batches are delivered. With `world` > 1 the loader is rank
  /// `rank`'s shard of a data-parallel job: every rank draws the same permutation, global batch k is its positions
  /// [k * B * world, (k + 1) * B * world), and rank r gets the r-th of `world` contiguous, near-equal slices of it
  /// (B each, except in a smaller last batch), so the ranks' k-th batches together are exactly one process's k-th
  /// batch of size B * world. Throws InvalidArgument for bad options, a rank outside [0, world), a split without
  /// frames or an example longer than example_length, FormatError when the view gives the split no example.
  BatchLoader(const Split& split, const data::views::View& view, int64_t example_length, const LoaderOptions& opts,
              uint64_t seed, at::Device device, int64_t rank = 0, int64_t world = 1);
  /// Stops the prefetch thread (stop()).
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// Examples per epoch (E; the same every epoch: a view gives each clip, or each group of copies, the same number
  /// of examples whatever the epoch; crops of a split with augmented copies: one per group).
  int64_t examples() const { return examples_count_; }
  /// Batches per epoch: ceil(E / G), or floor with drop_last, for the global batch G = batch_size * world. With
  /// world > 1 a last global batch of fewer than `world` samples is dropped too (a rank would get none).
  int64_t batches_per_epoch() const;
  /// Rank `rank`'s slice of global batch `batch`: its first position in the epoch's order, and its size.
  std::pair<int64_t, int64_t> slice_of(int64_t batch) const;
  /// Whether the split's frames live on the device (the --gpu-mem budget held them).
  bool device_resident() const { return resident_frames_.defined(); }
  /// Bytes a device-resident copy of the frames takes ((N + 1) * n_mels * 4: every frame and one pad row).
  int64_t resident_bytes() const;
  /// Frames every batch is padded to (0: each batch's longest example).
  int64_t example_length() const { return example_length_; }

  /// The examples of epoch `epoch` (view.examples of the split's clip frame counts and groups of copies,
  /// SplitInfo::group_offsets, for (seed, epoch)), clip by clip.
  std::vector<data::views::Example> epoch_examples(int64_t epoch) const;
  /// Epoch `epoch`'s order: int64 [E], a permutation of [0, E) (positions into epoch_examples(epoch)) drawn from
  /// a CPU generator seeded with a mix of (seed, epoch); the same for the same pair, whatever happened before.
  /// For a streamed split the permutation is windowed (see the file comment): window_bounds() gives the windows.
  at::Tensor epoch_order(int64_t epoch) const;
  /// Streamed split: the positions in epoch_order(epoch) where each window starts, then E: int64 [windows + 1].
  /// In RAM: {0, E}.
  std::vector<int64_t> window_bounds(int64_t epoch) const;
  /// Shuffle blocks of a streamed split: the first clip of each block, then F ([blocks + 1]); empty in RAM.
  const std::vector<int64_t>& block_clips() const { return block_first_; }
  /// Blocks per shuffle window of a streamed split; 0 in RAM.
  int64_t window_blocks() const { return window_blocks_; }
  /// Gathers the examples at positions `positions` (int64 [B], CPU) of epoch_examples(epoch) on the caller's
  /// thread through gather_examples (data/dataset.h; a streamed split reads each clip involved on its own) and
  /// delivers them to the device: the reference the prefetch thread and the device-resident path must match.
  Batch gather(const at::Tensor& positions, int64_t index, int64_t epoch) const;

  /// Starts epoch `epoch` (stopping an unfinished one first) and, with prefetch > 0 on a host-resident split,
  /// the thread that gathers its batches in order.
  void start_epoch(int64_t epoch);
  /// The next batch of the current epoch, or nullopt when the epoch is done. Rethrows an error of the prefetch
  /// thread. Throws InvalidArgument when no epoch was started.
  std::optional<Batch> next();
  /// Stops and joins the prefetch thread; pending batches are dropped and next() needs a new start_epoch(). Safe
  /// to call at any time, repeatedly.
  void stop();
  /// Quiesces the prefetch thread: returns once it is not gathering or delivering a batch, and keeps it from
  /// starting another until resume(). From then on it makes no CUDA call (no pinned-memory allocation, no
  /// host-to-device copy, no event), which a CUDA Graph capture on the calling thread needs. Batches already
  /// queued stay: next() returns them, and throws InvalidArgument when none is ready (it would wait forever).
  /// The pause outlasts stop() and start_epoch() until resume(); pausing twice is pausing once. Without a prefetch
  /// thread (prefetch 0, a device-resident split) next() gathers on the caller's thread and the pause changes
  /// nothing. The reader threads of a streamed split are not paused: they only read HDF5 chunks into CPU memory.
  /// The batches, their order and their contents are the same with and without pauses.
  void pause();
  /// Lets the prefetch thread go on after pause(); nothing when not paused.
  void resume();
  /// Whether pause() is in effect.
  bool paused() const;
  /// Batches the prefetch thread has gathered that next() has not yet returned (0 without a prefetch thread).
  int64_t ready() const;
  /// Seconds next() spent waiting for the prefetch thread (or gathering, without one) since start_epoch().
  double wait_seconds() const { return wait_seconds_; }

 private:
  /// One epoch's examples and order, and for a streamed split the windows and each position's clip row in its
  /// window.
  struct Plan {
    std::vector<data::views::Example> examples;  // the epoch's examples, clip by clip
    at::Tensor order;                            // int64 [E] positions into `examples`
    std::vector<int64_t> bounds;                 // window starts in `order`, then E
    std::vector<std::vector<int64_t>> blocks;    // blocks of each window, in read order
    std::vector<int64_t> rows;                   // streamed: first row of order[i]'s clip in its window's frames
  };
  /// A window's frames, float32 [frames of its blocks' clips, n_mels] on the CPU, block after block in read order.
  struct Window {
    int64_t id = -1;
    at::Tensor frames;
  };

  Plan plan(int64_t epoch) const;
  int64_t plan_window(Plan& p, const std::vector<int64_t>& window, int64_t begin, const at::Generator& gen) const;
  at::Tensor read_window(const std::vector<int64_t>& blocks) const;
  Batch gather_batch(int64_t batch);
  Batch gather_resident(int64_t batch) const;
  const at::Tensor& window(int64_t id);
  void read_ahead(int64_t id);
  Batch deliver(at::Tensor x, at::Tensor y, at::Tensor lengths, at::Tensor clip, int64_t index) const;
  void produce();
  bool wait_for_room();
  int64_t global_size_of(int64_t batch, int64_t local) const;
  int64_t batch_length(int64_t first, int64_t n) const;

  const Split& split_;
  const data::views::View& view_;
  int64_t example_length_ = 0;
  LoaderOptions opts_;
  uint64_t seed_;
  at::Device device_;
  int64_t rank_ = 0, world_ = 1;
  std::vector<int64_t> clip_frames_;    // [F] frames of each clip
  std::vector<int64_t> group_offsets_;  // [groups + 1] groups of copies (SplitInfo::group_offsets)
  std::vector<int64_t> label_;          // [F] label of each clip
  int64_t examples_count_ = 0;          // E
  at::Tensor resident_frames_;          // [N + 1, M] on the device when resident (row N: the pad value)
  std::vector<int64_t> block_first_;    // streamed: first clip of each block, then F
  int64_t window_blocks_ = 0;           // streamed: blocks per window
  Plan plan_;                           // the current epoch's examples, order and windows
  std::deque<Window> windows_;                    // streamed: loaded windows in use, oldest first
  std::future<Window> next_window_;               // streamed: the window being read ahead
  int64_t epoch_ = -1;                            // the current epoch
  std::future<std::pair<Plan, Window>> carry_;    // streamed: the next epoch's plan and first window, read ahead
  int64_t carry_epoch_ = -1;                      // the epoch carry_ was started for
  int64_t next_batch_ = 0;
  bool started_ = false;
  double wait_seconds_ = 0;

  std::thread worker_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stopping_ = false;
  bool produced_all_ = false;
  bool paused_ = false;  // pause(): the prefetch thread starts no batch
  bool busy_ = false;    // the prefetch thread is gathering or delivering a batch
  std::exception_ptr worker_error_;
};

/// pause() for a scope: the loader's prefetch thread is quiet from construction to destruction (also when an
/// exception leaves the scope), e.g. around a CUDA Graph capture.
class LoaderPause {
 public:
  /// Pauses `loader` (BatchLoader::pause), which must outlive this object.
  explicit LoaderPause(BatchLoader& loader);
  /// Resumes the loader.
  ~LoaderPause();
  LoaderPause(const LoaderPause&) = delete;
  LoaderPause& operator=(const LoaderPause&) = delete;

 private:
  BatchLoader& loader_;
};

}  // namespace melforge::trainer
