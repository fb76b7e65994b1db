#include "loader/example_loader.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>

#include "melforge/common/errors.h"
#include "views/clips.h"
#include "views/gather.h"

namespace melforge::data {

void LoaderOptions::validate() const {
  if (batch_size < 1) throw InvalidArgument("batch_size must be >= 1, got " + std::to_string(batch_size));
  if (prefetch < 0) throw InvalidArgument("prefetch must be >= 0, got " + std::to_string(prefetch));
  if (pool_chunks < 1) throw InvalidArgument("pool_chunks must be >= 1, got " + std::to_string(pool_chunks));
  if (in_memory < -1 || in_memory > 1)
    throw InvalidArgument("in_memory must be -1 (auto), 0 or 1, got " + std::to_string(in_memory));
  if (frame_budget < 0) throw InvalidArgument("frame_budget must be >= 0, got " + std::to_string(frame_budget));
  if (frame_budget > 0 && drop_last)
    throw InvalidArgument("drop_last applies to fixed-size batches, not to batches by length (frame_budget > 0)");
}

/// Released batch buffers, shared with the deleters of the batches handed out (which may outlive the loader).
struct ExampleLoader::Buffers {
  std::mutex mutex;
  std::vector<std::unique_ptr<Batch>> free;
};

ExampleLoader::ExampleLoader(SplitInfo split, std::shared_ptr<const views::View> view, uint64_t view_seed,
                             const LoaderOptions& opts, float pad_value)
    : split_(std::move(split)),
      view_(std::move(view)),
      view_seed_(view_seed),
      opts_(opts),
      pad_value_(pad_value),
      buffers_(std::make_shared<Buffers>()) {
  opts_.validate();
  if (!view_) throw InvalidArgument("ExampleLoader: no view");
  if (split_.files() == 0)
    throw FormatError("split '" + split_.name + "' (" + split_.path.string() + ") has no clip");
  reader_ = std::make_unique<ClipReader>(split_, 0);
  clip_frames_ = split_.clip_frame_counts();
  group_offsets_ = split_.group_offsets();
  n_mels_ = split_.info.n_mels;
  classes_ = split_.multilabel() ? static_cast<int64_t>(split_.class_names.size()) : 0;
  block_clips_.push_back(0);
  for (int64_t c = 1; c < split_.files(); ++c)
    if (reader_->chunk_of_clip(c) != reader_->chunk_of_clip(c - 1)) block_clips_.push_back(c);
  block_clips_.push_back(split_.files());
  const int64_t available = available_memory_bytes();
  in_memory_ = opts_.in_memory == 1 || (opts_.in_memory == -1 && available >= 0 && resident_bytes() <= available / 2);
  plan_ = make_plan(0);
}

ExampleLoader::~ExampleLoader() { stop(); }

std::vector<views::Example> ExampleLoader::examples(int64_t epoch) const {
  return view_->examples(clip_frames_, view_seed_, epoch, group_offsets_);
}

std::vector<std::vector<int64_t>> ExampleLoader::length_batches(const std::vector<views::Example>& examples,
                                                                int64_t epoch) const {
  std::vector<std::vector<int64_t>> out;
  for (const views::ClipBatch& b : views::batch_by_length(examples, opts_.frame_budget))
    for (std::size_t i = 0; i < b.members.size(); i += static_cast<std::size_t>(opts_.batch_size))
      out.emplace_back(b.members.begin() + static_cast<std::ptrdiff_t>(i),
                       b.members.begin() + static_cast<std::ptrdiff_t>(
                                               std::min(b.members.size(), i + static_cast<std::size_t>(
                                                                                      opts_.batch_size))));
  if (!opts_.shuffle) return out;
  std::vector<int64_t> pick(out.size());
  std::iota(pick.begin(), pick.end(), 0);
  shuffle_epoch(pick, opts_.seed, epoch);
  std::vector<std::vector<int64_t>> shuffled;
  for (const int64_t i : pick) shuffled.push_back(std::move(out[static_cast<std::size_t>(i)]));
  return shuffled;
}

ExampleLoader::EpochPlan ExampleLoader::make_plan(int64_t epoch) const {
  EpochPlan p;
  p.examples = examples(epoch);
  if (opts_.frame_budget > 0) {
    p.batches = length_batches(p.examples, epoch);
    for (const auto& b : p.batches) p.order.insert(p.order.end(), b.begin(), b.end());
    return p;
  }
  std::vector<int64_t> example_offsets(clip_frames_.size() + 1, 0);
  for (const views::Example& e : p.examples) ++example_offsets[static_cast<std::size_t>(e.clip) + 1];
  std::partial_sum(example_offsets.begin(), example_offsets.end(), example_offsets.begin());
  p.shuffle = plan_epoch(block_clips_, example_offsets, split_.frame_offset, opts_.pool_chunks, opts_.shuffle,
                         opts_.seed, epoch);
  p.order = p.shuffle.order;
  return p;
}

std::vector<int64_t> ExampleLoader::order(int64_t epoch) const { return make_plan(epoch).order; }

int64_t ExampleLoader::batches_per_epoch() const {
  if (opts_.frame_budget > 0) return static_cast<int64_t>(plan_.batches.size());
  const int64_t n = size(), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t ExampleLoader::resident_bytes() const {
  return split_.total_frames() * n_mels_ * static_cast<int64_t>(sizeof(float));
}

int64_t ExampleLoader::pool_bytes() const {
  std::vector<int64_t> frames;
  for (std::size_t b = 0; b + 1 < block_clips_.size(); ++b)
    frames.push_back(split_.frame_offset[static_cast<std::size_t>(block_clips_[b + 1])] -
                     split_.frame_offset[static_cast<std::size_t>(block_clips_[b])]);
  const auto k = static_cast<std::ptrdiff_t>(std::min<int64_t>(opts_.pool_chunks, static_cast<int64_t>(frames.size())));
  std::partial_sort(frames.begin(), frames.begin() + k, frames.end(), std::greater<>());
  return std::accumulate(frames.begin(), frames.begin() + k, int64_t{0}) * n_mels_ *
         static_cast<int64_t>(sizeof(float));
}

void ExampleLoader::load_resident() {
  std::vector<float> all(static_cast<std::size_t>(split_.total_frames() * n_mels_));
  for (std::size_t b = 0; b + 1 < block_clips_.size(); ++b) {
    const int64_t c0 = block_clips_[b], c1 = block_clips_[b + 1];
    reader_->read_clips(c0, c1 - c0, all.data() + split_.frame_offset[static_cast<std::size_t>(c0)] * n_mels_);
  }
  resident_ = std::move(all);
}

ExampleLoader::Pool ExampleLoader::read_pool(int64_t id) const {
  const std::vector<int64_t>& blocks = plan_.shuffle.pools[static_cast<std::size_t>(id)];
  int64_t frames = 0;
  for (const int64_t b : blocks)
    frames += split_.frame_offset[static_cast<std::size_t>(block_clips_[static_cast<std::size_t>(b) + 1])] -
              split_.frame_offset[static_cast<std::size_t>(block_clips_[static_cast<std::size_t>(b)])];
  Pool p{id, std::vector<float>(static_cast<std::size_t>(frames * n_mels_))};
  float* dst = p.frames.data();
  for (const int64_t b : blocks) {
    const int64_t c0 = block_clips_[static_cast<std::size_t>(b)], c1 = block_clips_[static_cast<std::size_t>(b) + 1];
    reader_->read_clips(c0, c1 - c0, dst);
    dst += (split_.frame_offset[static_cast<std::size_t>(c1)] - split_.frame_offset[static_cast<std::size_t>(c0)]) *
           n_mels_;
  }
  return p;
}

const std::vector<float>& ExampleLoader::pool(int64_t id) {
  while (!pools_.empty() && pools_.front().id < id) pools_.pop_front();
  if (pools_.empty() || pools_.back().id != id) {
    Pool next;
    if (next_pool_.valid()) next = next_pool_.get();
    if (next.id != id) next = read_pool(id);
    pools_.push_back(std::move(next));
  }
  if (id + 1 < static_cast<int64_t>(plan_.shuffle.pools.size()) && !next_pool_.valid())
    next_pool_ = std::async(std::launch::async, [this, id] { return read_pool(id + 1); });
  return pools_.back().frames;
}

std::shared_ptr<Batch> ExampleLoader::take_buffer() {
  std::unique_ptr<Batch> b;
  {
    std::lock_guard lock(buffers_->mutex);
    if (!buffers_->free.empty()) {
      b = std::move(buffers_->free.back());
      buffers_->free.pop_back();
    }
  }
  if (!b) b = std::make_unique<Batch>();
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

void ExampleLoader::fill_row(Batch& b, int64_t row, const views::Example& e, const float* clip_frames) {
  const auto r = static_cast<std::size_t>(row);
  b.lengths[r] = views::gather_example(e, clip_frames, n_mels_, b.length, pad_value_,
                                       b.x.data() + row * n_mels_ * b.length);
  b.y[r] = split_.labels[static_cast<std::size_t>(e.clip)];
  b.clip[r] = e.clip;
  b.start[r] = e.start;
  for (int64_t c = 0; c < classes_; ++c)
    b.targets[r * static_cast<std::size_t>(classes_) + static_cast<std::size_t>(c)] =
        split_.targets[static_cast<std::size_t>(e.clip * classes_ + c)];
}

std::shared_ptr<const Batch> ExampleLoader::assemble(int64_t index) {
  std::vector<int64_t> members;
  if (opts_.frame_budget > 0) {
    members = plan_.batches[static_cast<std::size_t>(index)];
  } else {
    const int64_t first = index * opts_.batch_size, n = std::min(opts_.batch_size, size() - first);
    members.assign(plan_.order.begin() + first, plan_.order.begin() + first + n);
  }
  std::shared_ptr<Batch> b = take_buffer();
  b->size = static_cast<int64_t>(members.size());
  b->index = index;
  b->length = 0;
  for (const int64_t m : members) b->length = std::max(b->length, plan_.examples[static_cast<std::size_t>(m)].length);
  const auto rows = static_cast<std::size_t>(b->size);
  b->x.resize(rows * static_cast<std::size_t>(n_mels_ * b->length));
  for (auto* v : {&b->lengths, &b->y, &b->clip, &b->start}) v->resize(rows);
  b->targets.resize(rows * static_cast<std::size_t>(classes_));
  if (in_memory_ && resident_.empty()) load_resident();
  for (int64_t i = 0; i < b->size; ++i) {
    views::Example e = plan_.examples[static_cast<std::size_t>(members[static_cast<std::size_t>(i)])];
    const float* clip = nullptr;
    if (in_memory_) {
      clip = resident_.data() + split_.frame_offset[static_cast<std::size_t>(e.clip)] * n_mels_;
    } else if (opts_.frame_budget == 0) {
      const int64_t pos = index * opts_.batch_size + i;
      const auto it = std::upper_bound(plan_.shuffle.bounds.begin(), plan_.shuffle.bounds.end(), pos);
      clip = pool(static_cast<int64_t>(it - plan_.shuffle.bounds.begin()) - 1).data() +
             plan_.shuffle.base[static_cast<std::size_t>(pos)] * n_mels_;
    } else {
      const int64_t first = e.repeat ? 0 : e.start, count = e.repeat ? e.clip_frames : e.real;
      scratch_.resize(static_cast<std::size_t>(count * n_mels_));
      reader_->read_frames(e.clip, first, count, scratch_.data());
      if (!e.repeat) e = {.clip = e.clip, .start = 0, .length = e.length, .real = e.real, .clip_frames = e.real};
      clip = scratch_.data();
    }
    fill_row(*b, i, e, clip);
  }
  return b;
}

void ExampleLoader::start_epoch(int64_t epoch) {
  stop();
  plan_ = make_plan(epoch);
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

void ExampleLoader::produce() {
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

std::shared_ptr<const Batch> ExampleLoader::next() {
  if (!started_) throw InvalidArgument("ExampleLoader::next: no epoch started");
  if (next_batch_ >= batches_per_epoch()) return nullptr;
  if (!worker_.joinable()) return assemble(next_batch_++);
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_ || produced_all_; });
  if (queue_.empty()) {
    if (error_) std::rethrow_exception(error_);
    throw Error("ExampleLoader: the background thread ended before batch " + std::to_string(next_batch_));
  }
  std::shared_ptr<const Batch> b = std::move(queue_.front());
  queue_.pop_front();
  ++next_batch_;
  cv_.notify_all();
  return b;
}

void ExampleLoader::stop() {
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
