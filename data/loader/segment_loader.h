#pragma once
/// Batches of a split's valid short segments (spectrogram float32 [B, n_mels, n_frames], label int64 [B], file row
/// int64 [B]), assembled by a background thread into reusable buffers, in the chunk-aware order of shuffle_plan.h.
///
/// A split held in RAM (LoaderOptions::in_memory) is read once, chunk by chunk, into [N, n_mels, n_frames] float32,
/// and batches are then copied from there. Otherwise the thread reads one pool of chunks at a time (one aligned read per chunk, so each chunk is inflated once per
/// epoch), the next pool on a second thread while the current one is gathered, and keeps up to `prefetch` batches
/// ready. Memory: up to three pools of float32 spectrograms (the pool being gathered, the previous one while a
/// batch straddles two, the one read ahead), pool_bytes() each, plus prefetch + 1 batch buffers and what the
/// caller holds. Batch buffers return to the loader when the caller drops its last reference and are reused.
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
#include "reader/mel_reader.h"
#include "reader/split_info.h"

namespace melforge::data {

/// SegmentLoader settings.
struct LoaderOptions {
  /// Short segments per batch, >= 1.
  int64_t batch_size = 64;
  /// Chunk-aware shuffle (shuffle_plan.h); false: file order.
  bool shuffle = true;
  /// Seed of the shuffle; with the epoch it fixes the order.
  uint64_t seed = 0;
  /// Drop the last batch of an epoch when it is smaller than batch_size.
  bool drop_last = false;
  /// Batches the background thread keeps ready, >= 0; 0 assembles each batch on the caller's thread.
  int64_t prefetch = 2;
  /// HDF5 chunks per shuffle pool, >= 1: more shuffles more globally and holds more memory (pool_bytes()).
  int64_t pool_chunks = 16;
  /// Keep the split's valid segments in RAM as float32 after reading them once (in the first epoch, chunk by
  /// chunk): 1 on, 0 off (stream every epoch), -1 auto (on when resident_bytes() is at most half of
  /// MemAvailable). The order is the same either way (the plan of shuffle_plan.h); in RAM a pool_chunks of at least
  /// the number of chunks gives a uniform permutation at no extra memory.
  int in_memory = -1;

  /// Throws InvalidArgument naming the field.
  void validate() const;
};

/// One batch; its buffers are reused once released.
struct Batch {
  /// Spectrograms, float32 [size, n_mels, n_frames] (the buffer holds batch_size rows).
  std::vector<float> x;
  /// Class labels, [size] (buffer of batch_size).
  std::vector<int64_t> y;
  /// File row in the split of each segment, [size] (buffer of batch_size).
  std::vector<int64_t> file;
  /// Segments in this batch.
  int64_t size = 0;
  /// Index of the batch within its epoch, 0-based.
  int64_t index = 0;
};

/// The batch source of one split file. start_epoch, next and stop are called from one thread.
class SegmentLoader {
 public:
  /// Opens `split.path` for reading. Throws InvalidArgument for bad options, FormatError when the split has no
  /// valid segment, IoError when the file cannot be opened.
  SegmentLoader(SplitInfo split, const LoaderOptions& opts);
  /// stop().
  ~SegmentLoader();
  SegmentLoader(const SegmentLoader&) = delete;
  SegmentLoader& operator=(const SegmentLoader&) = delete;

  /// The split's metadata.
  const SplitInfo& split() const { return split_; }
  /// The options.
  const LoaderOptions& options() const { return opts_; }
  /// Valid short segments (N).
  int64_t segments() const { return offsets_.back(); }
  /// Batches per epoch: ceil(N / batch_size), or floor with drop_last.
  int64_t batches_per_epoch() const;
  /// Files per HDF5 chunk of the split.
  int64_t files_per_chunk() const { return reader_->files_per_chunk(); }
  /// Float32 bytes of one shuffle pool: pool_chunks * files_per_chunk * num_long * num_short * n_mels * n_frames * 4.
  int64_t pool_bytes() const;
  /// Float32 bytes of the split's valid segments held in RAM (N * n_mels * n_frames * 4).
  int64_t resident_bytes() const;
  /// Whether the segments are (or will be, after the first epoch's reads) held in RAM.
  bool in_memory() const { return in_memory_; }
  /// Chunks covered by the reads so far (MelReader::chunks_read): each chunk once per epoch.
  int64_t chunks_read() const { return reader_->chunks_read(); }
  /// Epoch `epoch`'s order (plan_epoch with this loader's options).
  ShufflePlan plan(int64_t epoch) const;

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
    std::vector<float> mel;
  };
  struct Buffers;

  Pool read_pool(int64_t id) const;
  void load_resident();
  const std::vector<float>& pool(int64_t id);
  std::shared_ptr<Batch> take_buffer();
  std::shared_ptr<const Batch> assemble(int64_t index);
  void produce();

  SplitInfo split_;
  LoaderOptions opts_;
  std::unique_ptr<MelReader> reader_;
  std::vector<int64_t> offsets_;
  int64_t segment_floats_ = 0;  // n_mels * n_frames
  int64_t segment_rows_ = 0;    // num_long * num_short
  bool in_memory_ = false;
  std::vector<float> resident_;  // [N, n_mels, n_frames] in valid-segment order, when in_memory_ and loaded
  ShufflePlan plan_;
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
