#pragma once
/// Batches of short-segment spectrograms from a Split: the valid short segments only (long segment
/// l < num_valid_long[f]), in a permutation that depends only on (seed, epoch), gathered by a background thread
/// into a bounded queue (pinned host memory and non-blocking copies when the device is CUDA), or sampled on the
/// device itself when the split fits the --gpu-mem budget.
///
/// A split held in RAM is shuffled globally. A streamed split (Split::streamed) is shuffled in windows: the files
/// are grouped into blocks of whole HDF5 chunks, the blocks are permuted, consecutive permuted blocks form windows
/// of at most --stream-window MiB of float32 spectrograms, and the segments are permuted within each window. A
/// window is read with one aligned read per block (each chunk inflated once), the next one on a reader thread
/// while the current one is gathered (during the last window, the first window of the next epoch), so at most
/// three windows are in memory.
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

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

struct Split;

/// Batch sampling settings.
struct LoaderOptions {
  /// Short segments per batch, >= 1.
  int64_t batch_size = 64;
  /// Drop the last batch of an epoch when it is smaller than batch_size (default: keep it).
  bool drop_last = false;
  /// Batches the background thread keeps ready, >= 0; 0 gathers each batch on the caller's thread.
  int64_t prefetch = 4;
  /// Device memory budget in MiB for keeping a split resident on a CUDA device (0: never). When the split's valid
  /// segments fit, they are copied to the device once and batches are gathered there.
  int64_t gpu_mem = 0;
  /// Streamed splits: float32 MiB of spectrograms per shuffle window (> 0; at least one HDF5 chunk of files is
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
  /// Spectrograms, float32 [B, n_mels, n_frames] on the loader's device.
  at::Tensor x;
  /// Class labels, int64 [B] on the loader's device.
  at::Tensor y;
  /// Index of the batch within its epoch, 0-based.
  int64_t index = 0;
  /// Samples of the global batch this one is a slice of (all ranks together); B when there is one rank.
  int64_t global_size = 0;
};

/// The batch source of one split. Methods are called from one thread (the training loop); the prefetch thread is
/// internal. The split must outlive the loader.
class BatchLoader {
 public:
  /// Indexes the valid short segments of `split` (its `mel` loaded on the CPU, or streamed). `seed` fixes every
  /// epoch's order; `device` is where batches are delivered. With `world` > 1 the loader is rank `rank`'s shard of
  /// a data-parallel job: every rank draws the same permutation, global batch k is its positions
  /// [k * B * world, (k + 1) * B * world), and rank r gets the r-th of `world` contiguous, near-equal slices of it
  /// (B each, except in a smaller last batch), so the ranks' k-th batches together are exactly one process's k-th
  /// batch of size B * world. Throws InvalidArgument for bad options, a rank outside [0, world) or a split without
  /// spectrograms, FormatError when the split has no valid segment.
  BatchLoader(const Split& split, const LoaderOptions& opts, uint64_t seed, at::Device device, int64_t rank = 0,
              int64_t world = 1);
  /// Stops the prefetch thread (stop()).
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// Number of valid short segments (N).
  int64_t segments() const { return segment_index_.size(0); }
  /// Batches per epoch: ceil(N / G), or floor with drop_last, for the global batch G = batch_size * world. With
  /// world > 1 a last global batch of fewer than `world` samples is dropped too (a rank would get none).
  int64_t batches_per_epoch() const;
  /// Rank `rank`'s slice of global batch `batch`: its first position in the epoch's order, and its size.
  std::pair<int64_t, int64_t> slice_of(int64_t batch) const;
  /// Whether the split lives on the device (the --gpu-mem budget held it).
  bool device_resident() const { return resident_mel_.defined(); }
  /// Bytes a device-resident copy of the valid segments takes (N * n_mels * n_frames * 4).
  int64_t resident_bytes() const;

  /// Epoch `epoch`'s order: int64 [N], a permutation of [0, N) (positions into the valid-segment list) drawn from
  /// a CPU generator seeded with a mix of (seed, epoch); the same for the same pair, whatever happened before.
  /// For a streamed split the permutation is windowed (see the file comment): window_bounds() gives the windows.
  at::Tensor epoch_order(int64_t epoch) const;
  /// Streamed split: the positions in epoch_order(epoch) where each window starts, then N: int64 [windows + 1].
  /// In RAM: {0, N}.
  std::vector<int64_t> window_bounds(int64_t epoch) const;
  /// Files per shuffle block (whole HDF5 chunks) of a streamed split; 0 in RAM.
  int64_t block_files() const { return block_files_; }
  /// Blocks per shuffle window of a streamed split; 0 in RAM.
  int64_t window_blocks() const { return window_blocks_; }
  /// Flat index of each valid segment into mel viewed as [F * L * S, M, T] (file-major, then long, then short),
  /// int64 [N], on the CPU.
  const at::Tensor& segment_index() const { return segment_index_; }
  /// Gathers the segments at valid-segment positions `positions` (int64 [B], CPU) on the caller's thread and
  /// delivers them to the device (the reference the prefetch thread must match; for a streamed split it reads
  /// each file involved on its own).
  Batch gather(const at::Tensor& positions, int64_t index) const;

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
  /// One epoch's order: positions, and for a streamed split the windows and each position's row in its window.
  struct Plan {
    at::Tensor order;                          // int64 [N]
    std::vector<int64_t> bounds;               // window starts in `order`, then N
    std::vector<std::vector<int64_t>> blocks;  // blocks of each window, in read order
    std::vector<int64_t> rows;                 // row of order[i] in its window's [files * L * S, M, T] tensor
  };
  /// A window's spectrograms, [files * L * S, M, T] float32 on the CPU.
  struct Window {
    int64_t id = -1;
    at::Tensor mel;
  };

  Plan plan(int64_t epoch) const;
  at::Tensor read_window(const std::vector<int64_t>& blocks) const;
  Batch gather_batch(int64_t batch);
  const at::Tensor& window(int64_t id);
  void read_ahead(int64_t id);
  Batch deliver(at::Tensor x, at::Tensor y, int64_t index) const;
  void produce();
  bool wait_for_room();
  at::Tensor positions_of(int64_t batch) const;
  int64_t global_size_of(int64_t batch, int64_t local) const;

  const Split& split_;
  LoaderOptions opts_;
  uint64_t seed_;
  at::Device device_;
  int64_t rank_ = 0, world_ = 1;
  at::Tensor flat_mel_;        // [F * L * S, M, T] view of split.mel (CPU)
  at::Tensor segment_index_;   // int64 [N]
  at::Tensor segment_label_;   // int64 [N]
  at::Tensor resident_mel_;    // [N, M, T] on the device when resident
  at::Tensor resident_label_;  // int64 [N] on the device when resident
  at::Tensor order_;           // int64 [N] positions of the current epoch (CPU)
  at::Tensor order_device_;    // the same on the device when resident
  int64_t segment_rows_ = 0;   // L * S
  std::vector<int64_t> file_position_;  // [F + 1] first valid-segment position of each file, then N
  int64_t block_files_ = 0;    // streamed: files per block
  int64_t window_blocks_ = 0;  // streamed: blocks per window
  Plan plan_;                  // streamed: the current epoch's windows
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
