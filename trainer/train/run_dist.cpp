#include "train/run.h"

#include <torch/cuda.h>

#include <cstdlib>

#include "melforge/common/errors.h"
#include "models/sync_batch_norm.h"
#include "util.h"

#ifdef MELFORGE_TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace melforge::trainer {

std::string Run::take_rank_device(int local_rank) {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const CudaDeviceChoice choice =
      choose_cuda_device(local_rank, static_cast<int>(torch::cuda::device_count()),
                         visible != nullptr ? std::optional<std::string>(visible) : std::nullopt);
  s_.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(choice.ordinal));
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(choice.ordinal));
  return choice.description;
#else
  throw InvalidArgument("local rank " + std::to_string(local_rank) + ": this melforge-train was built without CUDA");
#endif
}

void Run::join_job(const DistOptions& dist) {
  if (cfg_.train.cuda_graph && s_.device.is_cuda())
    throw InvalidArgument("--cuda-graph cannot be combined with data-parallel training (the gradient all-reduce "
                          "runs between backward and the optimizer step)");
  const std::string device = s_.device.is_cuda() ? take_rank_device(dist.local_rank)
                                                 : "local rank " + std::to_string(dist.local_rank) + " -> cpu";
  Stopwatch watch;
  group_ = std::make_unique<ProcessGroup>(dist, s_.device);
  rank_log_.info(fmt("rank %d of %d, %s: joined the job through c10d (%s process group, store at %s:%d) in %.1f s",
                     rank_, world_, device.c_str(), group_->backend().c_str(), dist.master_addr.c_str(),
                     group_->port(), watch.seconds()));
}

void Run::sync_model() {
  std::vector<at::Tensor> tensors;
  for (const auto& p : model_->parameters()) tensors.push_back(p.data());
  for (const auto& b : model_->buffers()) tensors.push_back(b);
  group_->broadcast(tensors, 0);
  grad_sync_ = std::make_unique<GradientSync>(*group_, params_, cfg_.dist.bucket_mib, cfg_.dist.overlap);
  log_.info(fmt("global batch %lld (%lld per rank x %d ranks); gradients all-reduced in %lld bucket(s)%s",
                static_cast<long long>(cfg_.loader.batch_size * world_), static_cast<long long>(cfg_.loader.batch_size),
                world_, static_cast<long long>(grad_sync_->buckets()),
                cfg_.dist.overlap ? ", overlapping backward" : ""));
}

bool Run::install_sync_bn() {
  if (!group_ || world_ < 2) {
    log_.info("--sync-bn: a job of one process; its batch norms already see the whole batch (no-op)");
    return false;
  }
  const int64_t layers = install_sync_batch_norm(*model_, group_.get());
  if (layers == 0) {
    log_.info("--sync-bn: the model (" + model_->kind() + ") has no batch norm (no-op)");
    return false;
  }
  log_.info(fmt("--sync-bn: %lld batch norm layer(s) normalise with the statistics of the global batch (%d ranks; "
                "one all-reduce per layer in the forward and one in the backward)",
                static_cast<long long>(layers), world_));
  return true;
}

}  // namespace melforge::trainer
