#pragma once
/// Data-parallel training through PyTorch's c10d: the job's rank and size (flags, else the variables torchrun and
/// Slurm set), the rendezvous through a c10d TCPStore, a Gloo (CPU) or NCCL (CUDA) process group, and the
/// bucketed gradient all-reduce. c10d's own types stay inside dist.cpp (pimpl), as CUDA stays out of headers.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "melforge/common/errors.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// A collective, the rendezvous or the store failed: a peer died, hung past --dist-timeout, or is unreachable.
/// The message names this rank, the operation and the backend's reason.
class DistError : public Error {
 public:
  using Error::Error;
};

/// Where this process stands in a data-parallel job, and how it talks to the others. Unset fields come from the
/// environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun), else SLURM_PROCID,
/// SLURM_NTASKS, SLURM_LOCALID (srun); without any, a single process (world size 1).
struct DistOptions {
  /// `auto` (NCCL on a CUDA device, Gloo on the CPU), `gloo` or `nccl`; `gloo` or `nccl` joins a process group
  /// even in a job of one process (forces_process_group()).
  std::string backend = "auto";
  /// This process's rank in [0, world_size); -1: from RANK, else SLURM_PROCID, else 0.
  int rank = -1;
  /// Processes in the job, >= 1; 0: from WORLD_SIZE, else SLURM_NTASKS, else 1. 1 given: a process group of one
  /// (forces_process_group()).
  int world_size = 0;
  /// Rank on this machine; the CUDA device is local_rank % the devices this process sees (choose_cuda_device);
  /// -1: from LOCAL_RANK, else SLURM_LOCALID, else 0.
  int local_rank = -1;
  /// Host of rank 0's TCPStore; empty: MASTER_ADDR, else 127.0.0.1.
  std::string master_addr;
  /// Port of rank 0's TCPStore, in [1, 65535]; 0: MASTER_PORT, else 29500, except in a job of one process, where
  /// it stays 0 after resolve(): the store then listens on a free port the system picks.
  int master_port = 0;
  /// Seconds a rendezvous or a collective may wait for the other ranks before it fails, > 0.
  double timeout = 300;
  /// Gradient bytes per all-reduce bucket, MiB (> 0): gradients are flattened into buckets of about this size.
  double bucket_mib = 25;
  /// Launch each bucket's all-reduce from the backward pass as soon as its gradients are ready (overlap), instead
  /// of all buckets after the backward pass.
  bool overlap = true;
  /// `--sync-bn`: in training mode every batch norm of the model normalises with the statistics of the global batch
  /// (all ranks), as PyTorch's SyncBatchNorm (models/sync_batch_norm.h); one more all-reduce per batch norm layer in
  /// the forward and one in the backward. A no-op in a job of one process and for a model without batch norm.
  bool sync_bn = false;

  /// Throws InvalidArgument naming the flag (the flags only; resolve() checks the environment's values).
  void validate() const;
  /// These options with every unset field taken from the environment (or its default). Throws InvalidArgument
  /// naming the flag or variable for a malformed or inconsistent value (rank outside [0, world size), ...).
  DistOptions resolve() const;
  /// Whether these flags ask for a c10d process group even in a job of one process: `--dist-backend gloo|nccl`
  /// or `--world-size 1` given. (A world size above 1 always has one.) Used by the smoke test of the c10d path.
  bool forces_process_group() const { return backend != "auto" || world_size == 1; }
};

/// The CUDA device a rank takes, and a line saying why.
struct CudaDeviceChoice {
  /// Device ordinal among the devices this process sees (after CUDA_VISIBLE_DEVICES), in [0, device count).
  int ordinal = 0;
  /// "local rank R -> cuda:O (R % N visible device(s); CUDA_VISIBLE_DEVICES=...)", for the log.
  std::string description;
};

/// The device of local rank `local_rank` (>= 0) in a process that sees `device_count` CUDA devices: ordinal
/// local_rank % device_count. With every device of the machine visible, local rank r takes device r; with one
/// device per process (Slurm's --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per process) every rank takes its
/// only device, 0. `visible_devices` is CUDA_VISIBLE_DEVICES (nullopt when unset); it only goes into the
/// description. Throws InvalidArgument when device_count < 1 (naming CUDA_VISIBLE_DEVICES) or local_rank < 0.
CudaDeviceChoice choose_cuda_device(int local_rank, int device_count, const std::optional<std::string>& visible_devices);

/// Registers --dist-backend --rank --world-size --local-rank --master-addr --master-port --dist-timeout
/// --bucket-mib --no-overlap --sync-bn.
void add_options(boost::program_options::options_description& desc, DistOptions& opts);

/// One process's membership in a c10d process group. Collectives are called in the same order on every rank.
class ProcessGroup {
 public:
  /// Joins the job of `resolved` (DistOptions::resolve()): rank 0 hosts the TCPStore at master_addr:master_port
  /// (under torchrun, whose agent hosts it when TORCHELASTIC_USE_AGENT_STORE=True, every rank is a client, as
  /// PyTorch's env:// rendezvous does), every rank connects and waits for all world_size ranks (up to `timeout`),
  /// then the backend connects them.
  /// `device` picks the backend for `auto`. Throws InvalidArgument for `nccl` without a CUDA device or a build
  /// without NCCL, DistError when the rendezvous fails.
  ProcessGroup(const DistOptions& resolved, at::Device device);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank, in [0, size()).
  int rank() const;
  /// Processes in the job.
  int size() const;
  /// `gloo` or `nccl`.
  const std::string& backend() const;
  /// Port of the TCPStore this process connected to (the one the system picked when the options asked for 0).
  int port() const;

  /// Overwrites `tensors` (on the backend's device, dense, contiguous) with rank `root`'s.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  /// Replaces each tensor by its elementwise sum over the ranks.
  void allreduce_sum(std::vector<at::Tensor>& tensors);
  /// Every rank passes `bytes`; rank 0 gets all of them by rank, the other ranks an empty vector. Goes through the
  /// TCPStore under `key` (use a fresh key per call), so it needs no device tensor.
  std::vector<std::string> gather_bytes(const std::string& key, const std::string& bytes);

  /// The implementation (c10d objects), for GradientSync.
  struct Impl;
  /// The implementation.
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// Averages the gradients of `params` over the ranks: the gradients are copied into flat buckets of about
/// bucket_mib MiB (parameters in reverse order, the order backward produces them), each bucket is summed with one
/// all-reduce and divided by the world size, and the results are written back into the parameters' .grad.
/// With `overlap`, a gradient hook on each parameter copies its gradient into its bucket as backward produces it
/// and launches the bucket's all-reduce asynchronously once all of its gradients are in, so communication runs
/// while backward computes the earlier layers.
class GradientSync {
 public:
  /// `params` (their .grad is read and written; every one must get a gradient in each synchronised backward).
  GradientSync(ProcessGroup& group, std::vector<at::Tensor> params, double bucket_mib, bool overlap);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Call before the backward pass whose gradients are to be averaged (the last micro-batch of an accumulation):
  /// arms the hooks (with overlap). Backward passes without it only accumulate locally.
  void prepare();
  /// Call after that backward pass: launches the buckets not yet launched, waits for all, and writes the averaged
  /// gradients into .grad. Throws DistError when a collective fails.
  void finish();
  /// Number of buckets.
  int64_t buckets() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace melforge::trainer
