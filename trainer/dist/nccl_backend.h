#pragma once
/// The NCCL backend, in its own translation unit (its headers need CUDA's and NCCL's); internal to dist.cpp.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace melforge::trainer {

/// A c10d NCCL process group of `size` ranks over `store`, for the current CUDA device, collectives timing out
/// after `timeout`. Throws InvalidArgument in a build without CUDA.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace melforge::trainer
