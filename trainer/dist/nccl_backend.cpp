#include "dist/nccl_backend.h"

#include "melforge/common/errors.h"

#ifdef MELFORGE_TRAINER_HAVE_NCCL
// c10d's NCCL backend is declared only when USE_C10D_NCCL is defined; the wheel's libtorch_cuda.so carries it.
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace melforge::trainer {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
#ifdef MELFORGE_TRAINER_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  throw InvalidArgument("--dist-backend nccl: this melforge-train was built without CUDA/NCCL; use gloo");
#endif
}

}  // namespace melforge::trainer
