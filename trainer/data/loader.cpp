#include "data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <vector>

#include "data/dataset.h"
#include "melforge/common/errors.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void LoaderOptions::validate() const {
  if (batch_size < 1) throw InvalidArgument("--batch-size must be >= 1, got " + std::to_string(batch_size));
  if (prefetch < 0) throw InvalidArgument("--prefetch must be >= 0, got " + std::to_string(prefetch));
  if (gpu_mem < 0) throw InvalidArgument("--gpu-mem must be >= 0 MiB, got " + std::to_string(gpu_mem));
}

nlohmann::json LoaderOptions::to_json() const {
  return {{"batch_size", batch_size}, {"drop_last", drop_last}, {"prefetch", prefetch}, {"gpu_mem", gpu_mem}};
}

LoaderOptions LoaderOptions::from_json(const nlohmann::json& j) {
  LoaderOptions o;
  try {
    if (j.contains("batch_size")) j.at("batch_size").get_to(o.batch_size);
    if (j.contains("drop_last")) j.at("drop_last").get_to(o.drop_last);
    if (j.contains("prefetch")) j.at("prefetch").get_to(o.prefetch);
    if (j.contains("gpu_mem")) j.at("gpu_mem").get_to(o.gpu_mem);
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
      "keep the training split on the CUDA device when its valid segments fit this budget (0: never)");
}

BatchLoader::BatchLoader(const Split& split, const LoaderOptions& opts, uint64_t seed, at::Device device)
    : split_(split), opts_(opts), seed_(seed), device_(device) {
  opts_.validate();
  if (!split.mel.defined() || !split.mel.device().is_cpu() || split.mel.dim() != 5)
    throw InvalidArgument("BatchLoader: split '" + split.name + "' has no spectrograms loaded in RAM");
  const int64_t files = split.mel.size(0), num_long = split.mel.size(1), num_short = split.mel.size(2);
  flat_mel_ = split.mel.reshape({files * num_long * num_short, split.mel.size(3), split.mel.size(4)});
  const at::Tensor nvl = split.num_valid_long.to(at::kLong).contiguous();
  const at::Tensor labels = split.label.to(at::kLong).contiguous();
  std::vector<int64_t> index, label;
  for (int64_t f = 0; f < files; ++f) {
    const int64_t valid = nvl.data_ptr<int64_t>()[f];
    const int64_t y = labels.data_ptr<int64_t>()[f];
    for (int64_t l = 0; l < valid && l < num_long; ++l)
      for (int64_t s = 0; s < num_short; ++s) {
        index.push_back((f * num_long + l) * num_short + s);
        label.push_back(y);
      }
  }
  if (index.empty()) throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no valid segment");
  const auto n = static_cast<int64_t>(index.size());
  segment_index_ = at::from_blob(index.data(), {n}, at::kLong).clone();
  segment_label_ = at::from_blob(label.data(), {n}, at::kLong).clone();
  if (device_.is_cuda() && opts_.gpu_mem > 0 && resident_bytes() <= opts_.gpu_mem * (int64_t{1} << 20)) {
    resident_mel_ = flat_mel_.index_select(0, segment_index_).to(device_);
    resident_label_ = segment_label_.to(device_);
  }
}

BatchLoader::~BatchLoader() { stop(); }

int64_t BatchLoader::batches_per_epoch() const {
  const int64_t n = segments(), b = opts_.batch_size;
  if (opts_.drop_last) return n >= b ? n / b : 0;
  return (n + b - 1) / b;
}

int64_t BatchLoader::resident_bytes() const {
  return segments() * flat_mel_.size(1) * flat_mel_.size(2) * static_cast<int64_t>(sizeof(float));
}

at::Tensor BatchLoader::epoch_order(int64_t epoch) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch))));
  return at::randperm(segments(), gen, at::TensorOptions().dtype(at::kLong));
}

at::Tensor BatchLoader::positions_of(int64_t batch) const {
  const int64_t start = batch * opts_.batch_size;
  return order_.narrow(0, start, std::min(opts_.batch_size, segments() - start));
}

Batch BatchLoader::gather(const at::Tensor& positions, int64_t index) const {
  Batch b;
  b.index = index;
  if (device_resident()) {
    const at::Tensor p = positions.to(device_);
    b.x = resident_mel_.index_select(0, p);
    b.y = resident_label_.index_select(0, p);
    return b;
  }
  const at::Tensor flat = segment_index_.index_select(0, positions);
  if (device_.is_cpu()) {
    b.x = flat_mel_.index_select(0, flat);
    b.y = segment_label_.index_select(0, positions);
    return b;
  }
  const auto pinned = at::TensorOptions().pinned_memory(true);
  at::Tensor x = at::empty({flat.size(0), flat_mel_.size(1), flat_mel_.size(2)}, pinned.dtype(at::kFloat));
  at::Tensor y = at::empty({flat.size(0)}, pinned.dtype(at::kLong));
  at::index_select_out(x, flat_mel_, 0, flat);
  at::index_select_out(y, segment_label_, 0, positions);
  b.x = x.to(device_, /*non_blocking=*/true);
  b.y = y.to(device_, /*non_blocking=*/true);
  return b;
}

void BatchLoader::start_epoch(int64_t epoch) {
  stop();
  order_ = epoch_order(epoch);
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

void BatchLoader::produce() {
  const int64_t total = batches_per_epoch();
  try {
    for (int64_t i = 0; i < total; ++i) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || static_cast<int64_t>(queue_.size()) < opts_.prefetch; });
        if (stopping_) return;
      }
      Batch b = gather(positions_of(i), i);
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      queue_.push_back(std::move(b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    worker_error_ = std::current_exception();
  }
  std::lock_guard lock(mutex_);
  produced_all_ = true;
  cv_.notify_all();
}

std::optional<Batch> BatchLoader::next() {
  if (!started_) throw InvalidArgument("BatchLoader::next: no epoch started");
  if (next_batch_ >= batches_per_epoch()) return std::nullopt;
  const double t0 = now_s();
  if (device_resident()) {
    const int64_t start = next_batch_ * opts_.batch_size;
    const at::Tensor p = order_device_.narrow(0, start, std::min(opts_.batch_size, segments() - start));
    Batch b{resident_mel_.index_select(0, p), resident_label_.index_select(0, p), next_batch_++};
    wait_seconds_ += now_s() - t0;
    return b;
  }
  if (!worker_.joinable()) {
    Batch b = gather(positions_of(next_batch_), next_batch_);
    ++next_batch_;
    wait_seconds_ += now_s() - t0;
    return b;
  }
  std::unique_lock lock(mutex_);
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
  started_ = false;
  std::lock_guard lock(mutex_);
  queue_.clear();
}

}  // namespace melforge::trainer
