#pragma once
/// Batches of a split's examples, as a view cuts them from its clips (views/view.h): x float32 [B, n_mels, T] (real
/// frames first, then the silence value), the real length of each row, its label, clip row and, for a multi-label
/// split, its targets; assembled by a background thread into reusable buffers. Every schema (ClipReader).
///
/// Two ways of batching:
/// - fixed (LoaderOptions::frame_budget 0; tiles, crops): batch_size examples per batch in the chunk-aware order of
///   shuffle_plan.h. T = the batch's longest example (tiles and crops: all one length).
/// - by length (frame_budget > 0; whole clips): views::batch_by_length under the budget, each such batch cut into
///   pieces of at most batch_size rows, in ascending length, or in a seeded random order with shuffle. T = the batch's
///   longest example.
///
/// A split held in RAM (LoaderOptions::in_memory) is read once, chunk by chunk, into [N, n_mels] float32 frames, and
/// batches are then gathered from there. Otherwise, fixed batching reads one pool of chunks at a time (one read per
/// chunk, so each chunk is inflated about once per epoch), the next pool on a second thread while the current one is
/// gathered, and keeps up to `prefetch` batches ready; by-length batching reads each example's frames when it gathers
/// it (through the chunk cache). Memory: up to three pools of float32 frames (pool_bytes() each), plus prefetch + 1
/// batch buffers and what the caller holds. Batch buffers return to the loader when the caller drops its last
/// reference and are reused.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loader/shuffle_plan.h"
#include "reader/clip_reader.h"
#include "reader/split_info.h"
#include "views/view.h"

namespace melforge::data {

/// ExampleLoader settings.
struct LoaderOptions {
  /// Examples per batch, >= 1 (by-length batching: at most this many).
  int64_t batch_size = 64;
  /// Chunk-aware shuffle (shuffle_plan.h), or by-length batches in random order; false: clip order (by length).
  bool shuffle = true;
  /// Seed of the shuffle; with the epoch it fixes the order.
  uint64_t seed = 0;
  /// Drop the last batch of an epoch when it is smaller than batch_size (fixed batching only).
  bool drop_last = false;
  /// Batches the background thread keeps ready, >= 0; 0 assembles each batch on the caller's thread.
  int64_t prefetch = 2;
  /// HDF5 chunks per shuffle pool, >= 1: more shuffles more globally and holds more memory (pool_bytes()).
  int64_t pool_chunks = 16;
  /// Keep the split's frames in RAM as float32 after reading them once (in the first epoch, chunk by chunk): 1 on, 0
  /// off (stream every epoch), -1 auto (on when resident_bytes() is at most half of MemAvailable). The order is the
  /// same either way.
  int in_memory = -1;
  /// 0: fixed batches of batch_size. > 0: by-length batches of at most this many padded frames (rows x the longest
  /// row; views::batch_by_length), for whole clips.
  int64_t frame_budget = 0;

  /// Throws InvalidArgument naming the field (also for drop_last with by-length batching).
  void validate() const;
};

/// One batch; its buffers are reused once released.
struct Batch {
  /// Examples, float32 [size, n_mels, length]: row i's first lengths[i] frames are real, the rest the pad value.
  std::vector<float> x;
  /// Real frames of each row, [size], each in [1, length].
  std::vector<int64_t> lengths;
  /// Class label of each row's clip, [size].
  std::vector<int64_t> y;
  /// Clip row in the split of each example, [size].
  std::vector<int64_t> clip;
  /// First clip frame of each example, [size].
  std::vector<int64_t> start;
  /// Multi-label targets of each row's clip, float32 [size, classes] (0 or 1); empty for a single-label split.
  std::vector<float> targets;
  /// Examples in this batch.
  int64_t size = 0;
  /// Frames per row (T): the longest example of the batch.
  int64_t length = 0;
  /// Index of the batch within its epoch, 0-based.
  int64_t index = 0;
};

/// The batch source of one split file read through one view. start_epoch, next and stop are called from one thread.
class ExampleLoader {
 public:
  /// Opens `split.path` for reading. `view` cuts the examples (crops drawn with `view_seed` and the epoch); rows are
  /// padded with `pad_value` (the split's silence value, mel::silence_value). Throws InvalidArgument for bad options
  /// or a null view, FormatError when the split has no clip, IoError when the file cannot be opened.
  ExampleLoader(SplitInfo split, std::shared_ptr<const views::View> view, uint64_t view_seed,
                const LoaderOptions& opts, float pad_value);
  /// stop().
  ~ExampleLoader();
  ExampleLoader(const ExampleLoader&) = delete;
  ExampleLoader& operator=(const ExampleLoader&) = delete;

  /// The split's metadata.
  const SplitInfo& split() const { return split_; }
  /// The options.
  const LoaderOptions& options() const { return opts_; }
  /// The examples of epoch `epoch` (the view's, group by group of copies: SplitInfo::group_offsets; the crops view
  /// gives one per group).
  std::vector<views::Example> examples(int64_t epoch) const;
  /// Examples of the epoch started last (epoch 0 before any), E.
  int64_t size() const { return static_cast<int64_t>(plan_.examples.size()); }
  /// Batches of the epoch started last (epoch 0 before any): fixed, ceil(E / batch_size) or floor with drop_last;
  /// by length, the batches of batch_by_length cut to batch_size rows.
  int64_t batches_per_epoch() const;
  /// Float32 bytes of one shuffle pool, at most: the frames of the pool_chunks largest blocks * n_mels * 4.
  int64_t pool_bytes() const;
  /// Float32 bytes of the split's frames held in RAM (N * n_mels * 4).
  int64_t resident_bytes() const;
  /// Whether the frames are (or will be, after the first epoch's reads) held in RAM.
  bool in_memory() const { return in_memory_; }
  /// Chunks covered by the reads so far (ClipReader::chunks_read).
  int64_t chunks_read() const { return reader_->chunks_read(); }
  /// Epoch `epoch`'s example order (fixed batching: plan_epoch with this loader's options; by length: the batches'
  /// members one batch after the other).
  std::vector<int64_t> order(int64_t epoch) const;

  /// Starts epoch `epoch` (stopping an unfinished one first) and, with prefetch > 0, the thread that assembles its
  /// batches in order.
  void start_epoch(int64_t epoch);
  /// The next batch of the current epoch, or null when the epoch is done. Blocks while the thread works; rethrows
  /// its error. Throws InvalidArgument when no epoch was started.
  std::shared_ptr<const Batch> next();
  /// Stops and joins the background threads; pending batches are dropped. Safe to call at any time, repeatedly.
  void stop();

 private:
  struct Pool {
    int64_t id = -1;
    std::vector<float> frames;
  };
  struct Buffers;
  /// One epoch: its examples, and their order (fixed batching: the shuffle plan; by length: the batches).
  struct EpochPlan {
    std::vector<views::Example> examples;
    std::vector<int64_t> order;
    ShufflePlan shuffle;
    std::vector<std::vector<int64_t>> batches;
  };

  EpochPlan make_plan(int64_t epoch) const;
  std::vector<std::vector<int64_t>> length_batches(const std::vector<views::Example>& examples, int64_t epoch) const;
  Pool read_pool(int64_t id) const;
  void load_resident();
  const std::vector<float>& pool(int64_t id);
  std::shared_ptr<Batch> take_buffer();
  void fill_row(Batch& b, int64_t row, const views::Example& e, const float* clip_frames);
  std::shared_ptr<const Batch> assemble(int64_t index);
  void produce();

  SplitInfo split_;
  std::shared_ptr<const views::View> view_;
  uint64_t view_seed_ = 0;
  LoaderOptions opts_;
  float pad_value_ = 0;
  std::unique_ptr<ClipReader> reader_;
  std::vector<int64_t> clip_frames_;
  std::vector<int64_t> group_offsets_;  // [groups + 1] (SplitInfo::group_offsets)
  std::vector<int64_t> block_clips_;
  int64_t n_mels_ = 0;
  int64_t classes_ = 0;
  bool in_memory_ = false;
  std::vector<float> resident_;  // [N, n_mels] frame-major, when in_memory_ and loaded
  EpochPlan plan_;
  std::vector<float> scratch_;
  std::deque<Pool> pools_;
  std::future<Pool> next_pool_;
  std::shared_ptr<Buffers> buffers_;
  int64_t next_batch_ = 0;
  bool started_ = false;

  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const Batch>> queue_;
  bool stopping_ = false;
  bool produced_all_ = false;
  std::exception_ptr error_;
};

}  // namespace melforge::data
