#include "data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/sub.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/splitmix.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// dst[i] = src[rows[i]] for every i, copied row by row on the calling thread. src and dst are contiguous float
/// tensors with rows of the same shape, rows a CPU int64 vector. The batches are gathered on the prefetch thread,
/// where ATen's index_select would start an OpenMP team of that thread's own whose workers spin beside the training
/// thread's team on the same cores (15% fewer training samples/s on 2 cores, docs/PERFORMANCE.md).
void copy_rows(const at::Tensor& src, const at::Tensor& rows, at::Tensor& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous() || src.scalar_type() != at::kFloat ||
      dst.scalar_type() != at::kFloat || rows.scalar_type() != at::kLong || dst.size(0) != rows.numel() ||
      src.numel() / std::max<int64_t>(src.size(0), 1) != dst.numel() / std::max<int64_t>(dst.size(0), 1)) {
    throw Error("BatchLoader: copy_rows needs contiguous float tensors with rows of one shape and one index per row");
  }
  const int64_t row = dst.size(0) > 0 ? dst.numel() / dst.size(0) : 0;
  const at::Tensor r = rows.contiguous();
  const int64_t* index = r.data_ptr<int64_t>();
  const float* from = src.data_ptr<float>();
  float* to = dst.data_ptr<float>();
  for (int64_t i = 0; i < r.numel(); ++i) {
    if (index[i] < 0 || index[i] >= src.size(0)) {
      throw Error("BatchLoader: row " + std::to_string(index[i]) + " outside [0, " + std::to_string(src.size(0)) + ")");
    }
    std::memcpy(to + i * row, from + index[i] * row, static_cast<std::size_t>(row) * sizeof(float));
  }
}

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
                     "short segments per training batch")(
      "drop-last", po::bool_switch(&opts.drop_last), "drop the last, smaller batch of each epoch")(
      "prefetch", po::value(&opts.prefetch)->default_value(opts.prefetch)->value_name("N"),
      "batches a background thread keeps ready (0: gather on the training thread)")(
      "gpu-mem", po::value(&opts.gpu_mem)->default_value(opts.gpu_mem)->value_name("MiB"),
      "keep the training split on the CUDA device when its valid segments fit this budget (0: never)")(
      "stream-window", po::value(&opts.stream_window)->default_value(opts.stream_window)->value_name("MiB"),
      "streamed splits: float32 spectrograms per shuffle window (up to three windows are held in RAM)");
}

BatchLoader::BatchLoader(const Split& split, const LoaderOptions& opts, uint64_t seed, at::Device device,
                         int64_t rank, int64_t world)
    : split_(split), opts_(opts), seed_(seed), device_(device), rank_(rank), world_(world) {
  opts_.validate();
  if (world < 1 || rank < 0 || rank >= world)
    throw InvalidArgument("BatchLoader: rank " + std::to_string(rank) + " outside [0, " + std::to_string(world) + ")");
  if (!split.has_mel())
    throw InvalidArgument("BatchLoader: split '" + split.name + "' has no spectrograms (neither loaded nor streamed)");
  if (!split.streamed() && (!split.mel.device().is_cpu() || split.mel.dim() != 5))
    throw InvalidArgument("BatchLoader: split '" + split.name + "' must hold [F, L, S, M, T] spectrograms on the CPU");
  const int64_t files = split.files(), num_long = split.info.num_long, num_short = split.info.num_short;
  segment_rows_ = num_long * num_short;
  if (!split.streamed()) flat_mel_ = split.mel.reshape({files * segment_rows_, split.info.n_mels, split.info.n_frames});
  const at::Tensor nvl = split.num_valid_long.to(at::kLong).contiguous();
  const at::Tensor labels = split.label.to(at::kLong).contiguous();
  std::vector<int64_t> index, label;
  file_position_.assign(1, 0);
  for (int64_t f = 0; f < files; ++f) {
    const int64_t valid = nvl.data_ptr<int64_t>()[f];
    const int64_t y = labels.data_ptr<int64_t>()[f];
    for (int64_t l = 0; l < valid && l < num_long; ++l)
      for (int64_t s = 0; s < num_short; ++s) {
        index.push_back((f * num_long + l) * num_short + s);
        label.push_back(y);
      }
    file_position_.push_back(static_cast<int64_t>(index.size()));
  }
  if (index.empty()) throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no valid segment");
  const auto n = static_cast<int64_t>(index.size());
  segment_index_ = at::from_blob(index.data(), {n}, at::kLong).clone();
  segment_label_ = at::from_blob(label.data(), {n}, at::kLong).clone();
  if (split.streamed()) {
    block_files_ = split.files_per_chunk();
    const double block_mib = static_cast<double>(block_files_ * segment_rows_ * split.info.n_mels *
                                                 split.info.n_frames * static_cast<int64_t>(sizeof(float))) /
                             (1 << 20);
    const int64_t blocks = (files + block_files_ - 1) / block_files_;
    window_blocks_ = std::clamp<int64_t>(static_cast<int64_t>(opts_.stream_window / block_mib), 1, blocks);
  }
  if (device_.is_cuda() && opts_.gpu_mem > 0 && resident_bytes() <= opts_.gpu_mem * (int64_t{1} << 20)) {
    if (!split.streamed()) {
      resident_mel_ = flat_mel_.index_select(0, segment_index_).to(device_);
    } else {
      resident_mel_ = at::empty({n, split.info.n_mels, split.info.n_frames},
                                at::TensorOptions().dtype(at::kFloat).device(device_));
      const int64_t block = std::max<int64_t>(block_files_, 1);
      for (int64_t f0 = 0; f0 < files; f0 += block) {
        const int64_t count = std::min(block, files - f0);
        const int64_t p0 = file_position_[f0], p1 = file_position_[f0 + count];
        const at::Tensor rows = at::sub(segment_index_.narrow(0, p0, p1 - p0), f0 * segment_rows_);
        const at::Tensor mel = split.read_files(f0, count).reshape({count * segment_rows_, split.info.n_mels,
                                                                    split.info.n_frames});
        resident_mel_.narrow(0, p0, p1 - p0).copy_(mel.index_select(0, rows));
      }
    }
    resident_label_ = segment_label_.to(device_);
  }
}

BatchLoader::~BatchLoader() {
  stop();
  if (carry_.valid()) carry_.wait();
}

int64_t BatchLoader::batches_per_epoch() const {
  const int64_t n = segments(), g = opts_.batch_size * world_;
  if (opts_.drop_last || n % g < world_) return n / g;
  return n / g + 1;
}

std::pair<int64_t, int64_t> BatchLoader::slice_of(int64_t batch) const {
  const int64_t g = opts_.batch_size * world_, first = batch * g, n = std::min(g, segments() - first);
  const int64_t begin = first + rank_ * n / world_, end = first + (rank_ + 1) * n / world_;
  return {begin, end - begin};
}

int64_t BatchLoader::resident_bytes() const {
  return segments() * split_.info.n_mels * split_.info.n_frames * static_cast<int64_t>(sizeof(float));
}

BatchLoader::Plan BatchLoader::plan(int64_t epoch) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch))));
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  Plan p;
  const int64_t n = segments();
  if (!split_.streamed() || device_resident()) {
    p.order = at::randperm(n, gen, long_opts);
    p.bounds = {0, n};
    return p;
  }
  const int64_t files = split_.files();
  const int64_t blocks = (files + block_files_ - 1) / block_files_;
  const at::Tensor block_perm = at::randperm(blocks, gen, long_opts);
  const int64_t* perm = block_perm.data_ptr<int64_t>();
  const int64_t* g = segment_index_.data_ptr<int64_t>();
  p.order = at::empty({n}, long_opts);
  int64_t* order = p.order.data_ptr<int64_t>();
  p.rows.resize(static_cast<size_t>(n));
  std::vector<int64_t> positions, rows;
  int64_t out = 0;
  for (int64_t w0 = 0; w0 < blocks; w0 += window_blocks_) {
    std::vector<int64_t> window(perm + w0, perm + std::min(w0 + window_blocks_, blocks));
    positions.clear();
    rows.clear();
    int64_t file_offset = 0;
    for (const int64_t b : window) {
      const int64_t f0 = b * block_files_, f1 = std::min(files, f0 + block_files_);
      for (int64_t q = file_position_[f0]; q < file_position_[f1]; ++q) {
        positions.push_back(q);
        rows.push_back((file_offset - f0) * segment_rows_ + g[q]);
      }
      file_offset += f1 - f0;
    }
    const auto size = static_cast<int64_t>(positions.size());
    const at::Tensor shuffle = at::randperm(size, gen, long_opts);
    const int64_t* sh = shuffle.data_ptr<int64_t>();
    p.bounds.push_back(out);
    for (int64_t i = 0; i < size; ++i) {
      order[out + i] = positions[static_cast<size_t>(sh[i])];
      p.rows[static_cast<size_t>(out + i)] = rows[static_cast<size_t>(sh[i])];
    }
    out += size;
    p.blocks.push_back(std::move(window));
  }
  p.bounds.push_back(n);
  return p;
}

at::Tensor BatchLoader::epoch_order(int64_t epoch) const { return plan(epoch).order; }

std::vector<int64_t> BatchLoader::window_bounds(int64_t epoch) const { return plan(epoch).bounds; }

int64_t BatchLoader::global_size_of(int64_t batch, int64_t local) const {
  if (world_ == 1) return local;
  const int64_t g = opts_.batch_size * world_;
  return std::min(g, segments() - batch * g);
}

at::Tensor BatchLoader::positions_of(int64_t batch) const {
  const auto [start, n] = slice_of(batch);
  return order_.narrow(0, start, n);
}

at::Tensor BatchLoader::read_window(const std::vector<int64_t>& blocks) const {
  int64_t files = 0;
  for (const int64_t b : blocks) files += std::min(split_.files(), (b + 1) * block_files_) - b * block_files_;
  const int64_t m = split_.info.n_mels, t = split_.info.n_frames;
  at::Tensor mel = at::empty({files * segment_rows_, m, t}, at::kFloat);
  float* dst = mel.data_ptr<float>();
  for (const int64_t b : blocks) {
    const int64_t f0 = b * block_files_, count = std::min(split_.files(), f0 + block_files_) - f0;
    split_.reader->read(f0, count, dst);
    split_.check_finite(f0, count, dst);
    dst += count * segment_rows_ * m * t;
  }
  return mel;
}

Batch BatchLoader::deliver(at::Tensor x, at::Tensor y, int64_t index) const {
  Batch b;
  b.index = index;
  b.global_size = global_size_of(index, y.size(0));
  if (device_.is_cpu()) {
    b.x = std::move(x);
    b.y = std::move(y);
  } else {
    b.x = x.to(device_, /*non_blocking=*/true);
    b.y = y.to(device_, /*non_blocking=*/true);
  }
  return b;
}

Batch BatchLoader::gather(const at::Tensor& positions, int64_t index) const {
  if (device_resident()) {
    Batch b;
    b.index = index;
    b.global_size = global_size_of(index, positions.size(0));
    const at::Tensor p = positions.to(device_);
    b.x = resident_mel_.index_select(0, p);
    b.y = resident_label_.index_select(0, p);
    return b;
  }
  const at::Tensor flat = segment_index_.index_select(0, positions);
  const auto host = at::TensorOptions().pinned_memory(device_.is_cuda());
  at::Tensor x = at::empty({flat.size(0), split_.info.n_mels, split_.info.n_frames}, host.dtype(at::kFloat));
  at::Tensor y = at::empty({flat.size(0)}, host.dtype(at::kLong));
  if (!split_.streamed()) {
    copy_rows(flat_mel_, flat, x);
  } else {
    std::map<int64_t, at::Tensor> files;
    const int64_t* g = flat.data_ptr<int64_t>();
    for (int64_t i = 0; i < flat.size(0); ++i) {
      const int64_t f = g[i] / segment_rows_;
      auto it = files.find(f);
      if (it == files.end()) it = files.emplace(f, split_.read_files(f, 1).reshape({segment_rows_, x.size(1), x.size(2)})).first;
      x[i].copy_(it->second[g[i] % segment_rows_]);
    }
  }
  at::index_select_out(y, segment_label_, 0, positions);
  return deliver(std::move(x), std::move(y), index);
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
  return windows_.back().mel;
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
  if (!split_.streamed() || device_resident()) return gather(positions_of(batch), batch);
  const auto [first, n] = slice_of(batch);
  const auto host = at::TensorOptions().pinned_memory(device_.is_cuda());
  at::Tensor x = at::empty({n, split_.info.n_mels, split_.info.n_frames}, host.dtype(at::kFloat));
  at::Tensor y = at::empty({n}, host.dtype(at::kLong));
  for (int64_t pos = first; pos < first + n;) {
    const auto it = std::upper_bound(plan_.bounds.begin(), plan_.bounds.end(), pos);
    const auto id = static_cast<int64_t>(it - plan_.bounds.begin()) - 1;
    const int64_t end = std::min(first + n, *it);
    const at::Tensor rows = at::from_blob(plan_.rows.data() + pos, {end - pos}, at::kLong);
    at::Tensor dst = x.narrow(0, pos - first, end - pos);
    copy_rows(window(id), rows, dst);
    pos = end;
  }
  at::index_select_out(y, segment_label_, 0, order_.narrow(0, first, n));
  return deliver(std::move(x), std::move(y), batch);
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
  order_ = plan_.order;
  if (device_resident()) order_device_ = order_.to(device_);
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
    const auto [start, n] = slice_of(next_batch_);
    const at::Tensor p = order_device_.narrow(0, start, n);
    Batch b{resident_mel_.index_select(0, p), resident_label_.index_select(0, p), next_batch_,
            global_size_of(next_batch_, n)};
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
