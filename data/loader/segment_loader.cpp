#include "loader/segment_loader.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "melforge/common/errors.h"

namespace melforge::data {

void LoaderOptions::validate() const {
  if (batch_size < 1) throw InvalidArgument("batch_size must be >= 1, got " + std::to_string(batch_size));
  if (prefetch < 0) throw InvalidArgument("prefetch must be >= 0, got " + std::to_string(prefetch));
  if (pool_chunks < 1) throw InvalidArgument("pool_chunks must be >= 1, got " + std::to_string(pool_chunks));
  if (in_memory < -1 || in_memory > 1)
    throw InvalidArgument("in_memory must be -1 (auto), 0 or 1, got " + std::to_string(in_memory));
}

/// Released batch buffers, shared with the deleters of the batches handed out (which may outlive the loader).
struct SegmentLoader::Buffers {
  std::mutex mutex;
  std::vector<std::unique_ptr<Batch>> free;
};

SegmentLoader::SegmentLoader(SplitInfo split, const LoaderOptions& opts)
    : split_(std::move(split)), opts_(opts), buffers_(std::make_shared<Buffers>()) {
  opts_.validate();
  offsets_ = split_.segment_offsets();
  if (offsets_.back() == 0)
    throw FormatError("split '" + split_.name + "' (" + split_.path.string() + ") has no valid segment");
  reader_ = std::make_unique<MelReader>(split_.path, 0);
  segment_floats_ = split_.info.n_mels * split_.info.n_frames;
  segment_rows_ = split_.info.num_long * split_.info.num_short;
  const int64_t available = available_memory_bytes();
  in_memory_ = opts_.in_memory == 1 || (opts_.in_memory == -1 && available >= 0 && resident_bytes() <= available / 2);
}

int64_t SegmentLoader::resident_bytes() const {
  return segments() * segment_floats_ * static_cast<int64_t>(sizeof(float));
}

void SegmentLoader::load_resident() {
  std::vector<float> all(static_cast<std::size_t>(segments() * segment_floats_));
  const int64_t fpc = files_per_chunk(), per_file = segment_rows_ * segment_floats_;
  std::vector<float> block(static_cast<std::size_t>(fpc * per_file));
  for (int64_t f0 = 0; f0 < split_.files(); f0 += fpc) {
    const int64_t count = std::min(fpc, split_.files() - f0);
    reader_->read(f0, count, block.data());
    split_.check_finite(f0, count, block.data());
    for (int64_t f = f0; f < f0 + count; ++f) {
      const int64_t p0 = offsets_[static_cast<std::size_t>(f)], p1 = offsets_[static_cast<std::size_t>(f) + 1];
      std::memcpy(all.data() + p0 * segment_floats_, block.data() + (f - f0) * per_file,
                  static_cast<std::size_t>((p1 - p0) * segment_floats_) * sizeof(float));
    }
  }
  resident_ = std::move(all);
}

SegmentLoader::~SegmentLoader() { stop(); }

int64_t SegmentLoader::batches_per_epoch() const {
  const int64_t n = segments(), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t SegmentLoader::pool_bytes() const {
  return opts_.pool_chunks * files_per_chunk() * segment_rows_ * segment_floats_ * static_cast<int64_t>(sizeof(float));
}

ShufflePlan SegmentLoader::plan(int64_t epoch) const {
  return plan_epoch(offsets_, split_.info.num_long, split_.info.num_short, files_per_chunk(), opts_.pool_chunks,
                    opts_.shuffle, opts_.seed, epoch);
}

SegmentLoader::Pool SegmentLoader::read_pool(int64_t id) const {
  const std::vector<int64_t>& blocks = plan_.pools[static_cast<std::size_t>(id)];
  const int64_t fpc = files_per_chunk(), per_file = segment_rows_ * segment_floats_;
  int64_t files = 0;
  for (const int64_t b : blocks) files += std::min(split_.files(), (b + 1) * fpc) - b * fpc;
  Pool p{id, std::vector<float>(static_cast<std::size_t>(files * per_file))};
  float* dst = p.mel.data();
  for (const int64_t b : blocks) {
    const int64_t f0 = b * fpc, count = std::min(split_.files(), f0 + fpc) - f0;
    reader_->read(f0, count, dst);
    split_.check_finite(f0, count, dst);
    dst += count * per_file;
  }
  return p;
}

const std::vector<float>& SegmentLoader::pool(int64_t id) {
  while (!pools_.empty() && pools_.front().id < id) pools_.pop_front();
  if (pools_.empty() || pools_.back().id != id) {
    Pool next;
    if (next_pool_.valid()) next = next_pool_.get();
    if (next.id != id) next = read_pool(id);
    pools_.push_back(std::move(next));
  }
  if (id + 1 < static_cast<int64_t>(plan_.pools.size()) && !next_pool_.valid())
    next_pool_ = std::async(std::launch::async, [this, id] { return read_pool(id + 1); });
  return pools_.back().mel;
}

std::shared_ptr<Batch> SegmentLoader::take_buffer() {
  std::unique_ptr<Batch> b;
  {
    std::lock_guard lock(buffers_->mutex);
    if (!buffers_->free.empty()) {
      b = std::move(buffers_->free.back());
      buffers_->free.pop_back();
    }
  }
  if (!b) {
    b = std::make_unique<Batch>();
    b->x.resize(static_cast<std::size_t>(opts_.batch_size * segment_floats_));
    b->y.resize(static_cast<std::size_t>(opts_.batch_size));
    b->file.resize(static_cast<std::size_t>(opts_.batch_size));
  }
  std::weak_ptr<Buffers> home = buffers_;
  return std::shared_ptr<Batch>(b.release(), [home](Batch* p) {
    if (auto h = home.lock()) {
      std::lock_guard lock(h->mutex);
      h->free.emplace_back(p);
      return;
    }
    delete p;
  });
}

std::shared_ptr<const Batch> SegmentLoader::assemble(int64_t index) {
  const int64_t first = index * opts_.batch_size;
  const int64_t n = std::min(opts_.batch_size, segments() - first);
  std::shared_ptr<Batch> b = take_buffer();
  b->size = n;
  b->index = index;
  const auto bytes = static_cast<std::size_t>(segment_floats_) * sizeof(float);
  if (in_memory_ && resident_.empty()) load_resident();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first + i;
    const int64_t q = plan_.order[static_cast<std::size_t>(pos)];
    const int64_t file = segment_at(offsets_, split_.info.num_short, q).file;
    b->y[static_cast<std::size_t>(i)] = split_.labels[static_cast<std::size_t>(file)];
    b->file[static_cast<std::size_t>(i)] = file;
    if (in_memory_) {
      std::memcpy(b->x.data() + i * segment_floats_, resident_.data() + q * segment_floats_, bytes);
      continue;
    }
    const auto it = std::upper_bound(plan_.bounds.begin(), plan_.bounds.end(), pos);
    const auto id = static_cast<int64_t>(it - plan_.bounds.begin()) - 1;
    const std::vector<float>& mel = pool(id);
    const int64_t row = plan_.rows[static_cast<std::size_t>(pos)];
    std::memcpy(b->x.data() + i * segment_floats_, mel.data() + row * segment_floats_, bytes);
  }
  return b;
}

void SegmentLoader::start_epoch(int64_t epoch) {
  stop();
  plan_ = plan(epoch);
  next_batch_ = 0;
  started_ = true;
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
    stopping_ = false;
    produced_all_ = false;
    error_ = nullptr;
  }
  if (opts_.prefetch > 0) worker_ = std::thread([this] { produce(); });
}

void SegmentLoader::produce() {
  const int64_t total = batches_per_epoch();
  try {
    for (int64_t i = 0; i < total; ++i) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || static_cast<int64_t>(queue_.size()) < opts_.prefetch; });
        if (stopping_) return;
      }
      std::shared_ptr<const Batch> b = assemble(i);
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
  }
  std::lock_guard lock(mutex_);
  produced_all_ = true;
  cv_.notify_all();
}

std::shared_ptr<const Batch> SegmentLoader::next() {
  if (!started_) throw InvalidArgument("SegmentLoader::next: no epoch started");
  if (next_batch_ >= batches_per_epoch()) return nullptr;
  if (!worker_.joinable()) return assemble(next_batch_++);
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_ || produced_all_; });
  if (queue_.empty()) {
    if (error_) std::rethrow_exception(error_);
    throw Error("SegmentLoader: the background thread ended before batch " + std::to_string(next_batch_));
  }
  std::shared_ptr<const Batch> b = std::move(queue_.front());
  queue_.pop_front();
  ++next_batch_;
  cv_.notify_all();
  return b;
}

void SegmentLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  if (next_pool_.valid()) next_pool_.wait();
  next_pool_ = {};
  pools_.clear();
  started_ = false;
  std::lock_guard lock(mutex_);
  queue_.clear();
}

}  // namespace melforge::data
