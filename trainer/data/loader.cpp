#include "data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <vector>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/splitmix.h"
#include "views/gather.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void LoaderOptions::validate() const {
  if (batch_size < 1) throw InvalidArgument("--batch-size must be >= 1, got " + std::to_string(batch_size));
  if (prefetch < 0) throw InvalidArgument("--prefetch must be >= 0, got " + std::to_string(prefetch));
  if (gpu_mem < 0) throw InvalidArgument("--gpu-mem must be >= 0 MiB, got " + std::to_string(gpu_mem));
  if (!(stream_window > 0))
    throw InvalidArgument("--stream-window must be > 0 MiB, got " + std::to_string(stream_window));
}

nlohmann::json LoaderOptions::to_json() const {
  return {{"batch_size", batch_size},
          {"drop_last", drop_last},
          {"prefetch", prefetch},
          {"gpu_mem", gpu_mem},
          {"stream_window", stream_window}};
}

LoaderOptions LoaderOptions::from_json(const nlohmann::json& j) {
  LoaderOptions o;
  try {
    if (j.contains("batch_size")) j.at("batch_size").get_to(o.batch_size);
    if (j.contains("drop_last")) j.at("drop_last").get_to(o.drop_last);
    if (j.contains("prefetch")) j.at("prefetch").get_to(o.prefetch);
    if (j.contains("gpu_mem")) j.at("gpu_mem").get_to(o.gpu_mem);
    if (j.contains("stream_window")) j.at("stream_window").get_to(o.stream_window);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("loader options: ") + e.what());
  }
  return o;
}

void add_options(po::options_description& desc, LoaderOptions& opts) {
  desc.add_options()("batch-size", po::value(&opts.batch_size)->default_value(opts.batch_size)->value_name("N"),
                     "examples per training batch")(
      "drop-last", po::bool_switch(&opts.drop_last), "drop the last, smaller batch of each epoch")(
      "prefetch", po::value(&opts.prefetch)->default_value(opts.prefetch)->value_name("N"),
      "batches a background thread keeps ready (0: gather on the training thread)")(
      "gpu-mem", po::value(&opts.gpu_mem)->default_value(opts.gpu_mem)->value_name("MiB"),
      "keep the training split's frames on the CUDA device when they fit this budget (0: never)")(
      "stream-window", po::value(&opts.stream_window)->default_value(opts.stream_window)->value_name("MiB"),
      "streamed splits: float32 frames per shuffle window (up to three windows are held in RAM)");
}

BatchLoader::BatchLoader(const Split& split, const data::views::View& view, int64_t example_length,
                         const LoaderOptions& opts, uint64_t seed, at::Device device, int64_t rank, int64_t world)
    : split_(split), view_(view), example_length_(example_length), opts_(opts), seed_(seed), device_(device),
      rank_(rank), world_(world) {
  opts_.validate();
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument("BatchLoader: rank " + std::to_string(rank) + " outside [0, " + std::to_string(world) + ")");
  if (!split.has_frames())
    throw InvalidArgument("BatchLoader: split '" + split.name + "' has no frames (neither loaded nor streamed)");
  if (!split.streamed() && !split.frames.device().is_cpu())
    throw InvalidArgument("BatchLoader: split '" + split.name + "' must hold its frames on the CPU");
  if (example_length < 0)
    throw InvalidArgument("BatchLoader: example length must be >= 0, got " + std::to_string(example_length));
  clip_frames_ = split.clip_frame_counts();
  group_offsets_ = split.meta.group_offsets();
  const at::Tensor labels = split.label.to(at::kLong).contiguous();
  label_.assign(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
  const std::vector<data::views::Example> first = epoch_examples(0);
  examples_count_ = static_cast<int64_t>(first.size());
  if (examples_count_ == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") gives no example through the " +
                      std::string(view.name()) + " view");
  for (const auto& e : first)
    if (example_length > 0 && e.length > example_length)
      throw InvalidArgument("BatchLoader: the " + std::string(view.name()) + " view makes examples of " +
                            std::to_string(e.length) + " frames, longer than the example length " +
                            std::to_string(example_length));
  if (split.streamed()) {
    block_first_.assign(1, 0);
    for (int64_t c = 0; c < split.files(); ++c) {
      if (c > 0 && split.reader->chunk_of_clip(c) != split.reader->chunk_of_clip(block_first_.back()))
        block_first_.push_back(c);
    }
    block_first_.push_back(split.files());
    const auto blocks = static_cast<int64_t>(block_first_.size()) - 1;
    const double block_mib = split.frame_bytes() / static_cast<double>(blocks) / (1 << 20);
    window_blocks_ = std::clamp<int64_t>(static_cast<int64_t>(opts_.stream_window / block_mib), 1, blocks);
  }
  if (device_.is_cuda() && opts_.gpu_mem > 0 && resident_bytes() <= opts_.gpu_mem * (int64_t{1} << 20)) {
    const int64_t n = split.total_frames(), m = split.info.n_mels;
    resident_frames_ = at::empty({n + 1, m}, at::TensorOptions().dtype(at::kFloat).device(device_));
    resident_frames_[n].fill_(split.pad_value());
    const int64_t block = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * m));
    const auto& off = split.meta.frame_offset;
    for (int64_t c0 = 0; c0 < split.files();) {
      int64_t c1 = c0 + 1;
      while (c1 < split.files() && off[static_cast<std::size_t>(c1 + 1)] - off[static_cast<std::size_t>(c0)] <= block)
        ++c1;
      const at::Tensor frames = split.read_clips(c0, c1 - c0);
      resident_frames_.narrow(0, off[static_cast<std::size_t>(c0)], frames.size(0)).copy_(frames);
      c0 = c1;
    }
  }
}

BatchLoader::~BatchLoader() {
  stop();
  if (carry_.valid()) carry_.wait();
}

int64_t BatchLoader::batches_per_epoch() const {
  const int64_t n = examples(), g = opts_.batch_size * world_;
  if (opts_.drop_last || n % g < world_) return n / g;
  return n / g + 1;
}

std::pair<int64_t, int64_t> BatchLoader::slice_of(int64_t batch) const {
  const int64_t g = opts_.batch_size * world_, first = batch * g, n = std::min(g, examples() - first);
  const int64_t begin = first + rank_ * n / world_, end = first + (rank_ + 1) * n / world_;
  return {begin, end - begin};
}

int64_t BatchLoader::resident_bytes() const {
  return (split_.total_frames() + 1) * split_.info.n_mels * static_cast<int64_t>(sizeof(float));
}

std::vector<data::views::Example> BatchLoader::epoch_examples(int64_t epoch) const {
  std::vector<data::views::Example> out = view_.examples(clip_frames_, seed_, epoch, group_offsets_);
  if (examples_count_ > 0 && static_cast<int64_t>(out.size()) != examples_count_)
    throw Error("BatchLoader: the " + std::string(view_.name()) + " view gives epoch " + std::to_string(epoch) + " " +
                std::to_string(out.size()) + " examples, epoch 0 " + std::to_string(examples_count_));
  return out;
}

BatchLoader::Plan BatchLoader::plan(int64_t epoch) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch))));
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  Plan p;
  p.examples = epoch_examples(epoch);
  const auto n = static_cast<int64_t>(p.examples.size());
  if (!split_.streamed() || device_resident()) {
    p.order = at::randperm(n, gen, long_opts);
    p.bounds = {0, n};
    return p;
  }
  const auto blocks = static_cast<int64_t>(block_first_.size()) - 1;
  const at::Tensor block_perm = at::randperm(blocks, gen, long_opts);
  const int64_t* perm = block_perm.data_ptr<int64_t>();
  p.order = at::empty({n}, long_opts);
  p.rows.resize(static_cast<size_t>(n));
  int64_t filled = 0;
  for (int64_t w0 = 0; w0 < blocks; w0 += window_blocks_) {
    const std::vector<int64_t> window(perm + w0, perm + std::min(w0 + window_blocks_, blocks));
    p.bounds.push_back(filled);
    filled += plan_window(p, window, filled, gen);
    p.blocks.push_back(window);
  }
  p.bounds.push_back(n);
  return p;
}

/// Writes the window of `window`'s blocks into `p` from position `begin` of its order: the examples of its clips,
/// shuffled, with the row of each example's clip in the window's frames. Returns the window's number of examples.
int64_t BatchLoader::plan_window(Plan& p, const std::vector<int64_t>& window, int64_t begin,
                                 const at::Generator& gen) const {
  const auto& off = split_.meta.frame_offset;
  std::vector<int64_t> block_row(block_first_.size(), -1);
  int64_t row = 0;
  for (const int64_t b : window) {
    block_row[static_cast<std::size_t>(b)] = row;
    row += off[static_cast<std::size_t>(block_first_[static_cast<std::size_t>(b + 1)])] -
           off[static_cast<std::size_t>(block_first_[static_cast<std::size_t>(b)])];
  }
  std::vector<int64_t> positions, rows;
  for (const int64_t b : window) {
    const int64_t c0 = block_first_[static_cast<std::size_t>(b)], c1 = block_first_[static_cast<std::size_t>(b + 1)];
    const auto lo = std::lower_bound(p.examples.begin(), p.examples.end(), c0,
                                     [](const data::views::Example& e, int64_t c) { return e.clip < c; });
    for (auto it = lo; it != p.examples.end() && it->clip < c1; ++it) {
      positions.push_back(it - p.examples.begin());
      rows.push_back(block_row[static_cast<std::size_t>(b)] + off[static_cast<std::size_t>(it->clip)] -
                     off[static_cast<std::size_t>(c0)]);
    }
  }
  const auto size = static_cast<int64_t>(positions.size());
  const at::Tensor shuffle = at::randperm(size, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* sh = shuffle.data_ptr<int64_t>();
  int64_t* order = p.order.data_ptr<int64_t>();
  for (int64_t i = 0; i < size; ++i) {
    order[begin + i] = positions[static_cast<size_t>(sh[i])];
    p.rows[static_cast<size_t>(begin + i)] = rows[static_cast<size_t>(sh[i])];
  }
  return size;
}

at::Tensor BatchLoader::epoch_order(int64_t epoch) const { return plan(epoch).order; }

std::vector<int64_t> BatchLoader::window_bounds(int64_t epoch) const { return plan(epoch).bounds; }

int64_t BatchLoader::global_size_of(int64_t batch, int64_t local) const {
  if (world_ == 1) return local;
  const int64_t g = opts_.batch_size * world_;
  return std::min(g, examples() - batch * g);
}

/// Frames batch positions [first, first + n) of the current plan are padded to: the example length, or the longest
/// of those examples.
int64_t BatchLoader::batch_length(int64_t first, int64_t n) const {
  if (example_length_ > 0) return example_length_;
  int64_t t = 1;
  const int64_t* order = plan_.order.data_ptr<int64_t>();
  for (int64_t i = first; i < first + n; ++i)
    t = std::max(t, plan_.examples[static_cast<std::size_t>(order[i])].length);
  return t;
}

at::Tensor BatchLoader::read_window(const std::vector<int64_t>& blocks) const {
  const auto& off = split_.meta.frame_offset;
  int64_t frames = 0;
  for (const int64_t b : blocks)
    frames += off[static_cast<std::size_t>(block_first_[static_cast<std::size_t>(b + 1)])] -
              off[static_cast<std::size_t>(block_first_[static_cast<std::size_t>(b)])];
  const int64_t m = split_.info.n_mels;
  at::Tensor out = at::empty({frames, m}, at::kFloat);
  float* dst = out.data_ptr<float>();
  for (const int64_t b : blocks) {
    const int64_t c0 = block_first_[static_cast<std::size_t>(b)], c1 = block_first_[static_cast<std::size_t>(b + 1)];
    split_.reader->read_clips(c0, c1 - c0, dst);
    dst += (off[static_cast<std::size_t>(c1)] - off[static_cast<std::size_t>(c0)]) * m;
  }
  return out;
}

Batch BatchLoader::deliver(at::Tensor x, at::Tensor y, at::Tensor lengths, at::Tensor clip, int64_t index) const {
  Batch b;
  b.index = index;
  b.global_size = global_size_of(index, y.size(0));
  if (device_.is_cpu()) {
    b.x = std::move(x);
    b.y = std::move(y);
    b.lengths = std::move(lengths);
    b.clip = std::move(clip);
  } else {
    b.x = x.to(device_, /*non_blocking=*/true);
    b.y = y.to(device_, /*non_blocking=*/true);
    b.lengths = lengths.to(device_, /*non_blocking=*/true);
    b.clip = clip.to(device_, /*non_blocking=*/true);
  }
  return b;
}

Batch BatchLoader::gather(const at::Tensor& positions, int64_t index, int64_t epoch) const {
  const std::vector<data::views::Example> all = epoch_examples(epoch);
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  std::vector<data::views::Example> picked;
  for (int64_t i = 0; i < pos.numel(); ++i) picked.push_back(all.at(static_cast<std::size_t>(pos.data_ptr<int64_t>()[i])));
  ExampleBatch g = gather_examples(split_, picked, example_length_);
  at::Tensor y = at::empty({pos.numel()}, at::kLong);
  for (int64_t i = 0; i < pos.numel(); ++i)
    y.data_ptr<int64_t>()[i] = label_[static_cast<std::size_t>(picked[static_cast<std::size_t>(i)].clip)];
  return deliver(std::move(g.x), std::move(y), std::move(g.lengths), std::move(g.clip), index);
}

/// Batch `batch` of a device-resident split: the frame row of every position ([B, T], the pad row N for padding)
/// built on the CPU, copied to the device, and the frames gathered there.
Batch BatchLoader::gather_resident(int64_t batch) const {
  const auto [first, n] = slice_of(batch);
  const int64_t t = batch_length(first, n), pad_row = split_.total_frames();
  at::Tensor index = at::empty({n, t}, at::kLong), y = at::empty({n}, at::kLong);
  at::Tensor lengths = at::empty({n}, at::kLong), clip = at::empty({n}, at::kLong);
  const int64_t* order = plan_.order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& e = plan_.examples[static_cast<std::size_t>(order[first + i])];
    const int64_t base = split_.meta.frame_offset[static_cast<std::size_t>(e.clip)];
    const std::vector<int64_t> source = data::views::source_frames(e, t);
    int64_t* row = index.data_ptr<int64_t>() + i * t;
    for (int64_t k = 0; k < t; ++k) row[k] = source[static_cast<std::size_t>(k)] < 0 ? pad_row : base + source[static_cast<std::size_t>(k)];
    y.data_ptr<int64_t>()[i] = label_[static_cast<std::size_t>(e.clip)];
    lengths.data_ptr<int64_t>()[i] = e.real;
    clip.data_ptr<int64_t>()[i] = e.clip;
  }
  Batch b;
  b.index = batch;
  b.global_size = global_size_of(batch, n);
  const at::Tensor rows = index.to(device_, /*non_blocking=*/false).view({-1});
  b.x = resident_frames_.index_select(0, rows).view({n, t, split_.info.n_mels}).transpose(1, 2).contiguous();
  b.y = y.to(device_);
  b.lengths = lengths.to(device_);
  b.clip = clip.to(device_);
  return b;
}

const at::Tensor& BatchLoader::window(int64_t id) {
  while (!windows_.empty() && windows_.front().id < id) windows_.pop_front();
  if (windows_.empty() || windows_.back().id != id) {
    Window next;
    if (next_window_.valid()) next = next_window_.get();
    if (next.id != id) next = Window{id, read_window(plan_.blocks[static_cast<size_t>(id)])};
    windows_.push_back(std::move(next));
  }
  read_ahead(id);
  return windows_.back().frames;
}

void BatchLoader::read_ahead(int64_t id) {
  const auto windows = static_cast<int64_t>(plan_.blocks.size());
  if (id + 1 < windows) {
    if (!next_window_.valid())
      next_window_ = std::async(std::launch::async, [this, id] {
        return Window{id + 1, read_window(plan_.blocks[static_cast<size_t>(id + 1)])};
      });
    return;
  }
  if (carry_.valid() || carry_epoch_ == epoch_ + 1) return;
  carry_epoch_ = epoch_ + 1;
  carry_ = std::async(std::launch::async, [this, epoch = epoch_ + 1] {
    Plan p = plan(epoch);
    Window w{0, read_window(p.blocks.front())};
    return std::pair{std::move(p), std::move(w)};
  });
}

Batch BatchLoader::gather_batch(int64_t batch) {
  if (device_resident()) return gather_resident(batch);
  const auto [first, n] = slice_of(batch);
  const int64_t t = batch_length(first, n), m = split_.info.n_mels;
  const auto host = at::TensorOptions().pinned_memory(device_.is_cuda());
  at::Tensor x = at::empty({n, m, t}, host.dtype(at::kFloat));
  at::Tensor y = at::empty({n}, host.dtype(at::kLong)), lengths = at::empty({n}, host.dtype(at::kLong));
  at::Tensor clip = at::empty({n}, host.dtype(at::kLong));
  const float pad = split_.pad_value();
  const int64_t* order = plan_.order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first + i;
    const auto& e = plan_.examples[static_cast<std::size_t>(order[pos])];
    const float* src = nullptr;
    if (!split_.streamed()) {
      src = split_.frames.data_ptr<float>() + split_.meta.frame_offset[static_cast<std::size_t>(e.clip)] * m;
    } else {
      const auto it = std::upper_bound(plan_.bounds.begin(), plan_.bounds.end(), pos);
      src = window(static_cast<int64_t>(it - plan_.bounds.begin()) - 1).data_ptr<float>() +
            plan_.rows[static_cast<std::size_t>(pos)] * m;
    }
    lengths.data_ptr<int64_t>()[i] = data::views::gather_example(e, src, m, t, pad, x.data_ptr<float>() + i * m * t);
    y.data_ptr<int64_t>()[i] = label_[static_cast<std::size_t>(e.clip)];
    clip.data_ptr<int64_t>()[i] = e.clip;
  }
  return deliver(std::move(x), std::move(y), std::move(lengths), std::move(clip), batch);
}

void BatchLoader::start_epoch(int64_t epoch) {
  stop();
  if (carry_.valid() && carry_epoch_ == epoch) {
    auto [p, w] = carry_.get();
    plan_ = std::move(p);
    windows_.push_back(std::move(w));
  } else {
    if (carry_.valid()) carry_.wait();
    carry_ = {};
    plan_ = plan(epoch);
  }
  epoch_ = epoch;
  next_batch_ = 0;
  wait_seconds_ = 0;
  started_ = true;
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
    stopping_ = false;
    produced_all_ = false;
    worker_error_ = nullptr;
  }
  if (opts_.prefetch > 0 && !device_resident()) worker_ = std::thread([this] { produce(); });
}

/// Waits until the queue has room and the loader is not paused, then marks the prefetch thread busy. Returns false
/// when the loader is stopping.
bool BatchLoader::wait_for_room() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return stopping_ || (!paused_ && static_cast<int64_t>(queue_.size()) < opts_.prefetch); });
  if (stopping_) return false;
  busy_ = true;
  return true;
}

/// The prefetch thread. Everything that may call CUDA (gathering into pinned memory, the copy to the device, and
/// releasing a batch that is not queued) happens while busy_ is set, so pause() can wait for it.
void BatchLoader::produce() {
  const int64_t total = batches_per_epoch();
  try {
    for (int64_t i = 0; i < total; ++i) {
      if (!wait_for_room()) return;
      Batch b = gather_batch(i);
      std::lock_guard lock(mutex_);
      const bool stopping = stopping_;
      if (stopping)
        b = Batch{};
      else
        queue_.push_back(std::move(b));
      busy_ = false;
      cv_.notify_all();
      if (stopping) return;
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    worker_error_ = std::current_exception();
    busy_ = false;
  }
  std::lock_guard lock(mutex_);
  produced_all_ = true;
  cv_.notify_all();
}

void BatchLoader::pause() {
  std::unique_lock lock(mutex_);
  paused_ = true;
  cv_.wait(lock, [&] { return !busy_; });
}

void BatchLoader::resume() {
  std::lock_guard lock(mutex_);
  paused_ = false;
  cv_.notify_all();
}

bool BatchLoader::paused() const {
  std::lock_guard lock(mutex_);
  return paused_;
}

int64_t BatchLoader::ready() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(queue_.size());
}

LoaderPause::LoaderPause(BatchLoader& loader) : loader_(loader) { loader_.pause(); }

LoaderPause::~LoaderPause() { loader_.resume(); }

std::optional<Batch> BatchLoader::next() {
  if (!started_) throw InvalidArgument("BatchLoader::next: no epoch started");
  if (next_batch_ >= batches_per_epoch()) return std::nullopt;
  const double t0 = now_s();
  if (device_resident()) {
    Batch b = gather_resident(next_batch_);
    ++next_batch_;
    wait_seconds_ += now_s() - t0;
    return b;
  }
  if (!worker_.joinable()) {
    Batch b = gather_batch(next_batch_);
    ++next_batch_;
    wait_seconds_ += now_s() - t0;
    return b;
  }
  std::unique_lock lock(mutex_);
  if (paused_ && queue_.empty() && !worker_error_ && !produced_all_)
    throw InvalidArgument("BatchLoader::next: the loader is paused and no batch is ready; resume() it first");
  cv_.wait(lock, [&] { return !queue_.empty() || worker_error_ || produced_all_; });
  wait_seconds_ += now_s() - t0;
  if (queue_.empty()) {
    if (worker_error_) std::rethrow_exception(worker_error_);
    throw Error("BatchLoader: the prefetch thread ended before batch " + std::to_string(next_batch_));
  }
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  ++next_batch_;
  cv_.notify_all();
  return b;
}

void BatchLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  if (next_window_.valid()) next_window_.wait();
  next_window_ = {};
  windows_.clear();
  started_ = false;
  std::lock_guard lock(mutex_);
  queue_.clear();
}

}  // namespace melforge::trainer
