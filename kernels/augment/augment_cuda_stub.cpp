// make_cuda_augmenter of a build without CUDA (MELFORGE_CUDA OFF): augment_cuda.cu is not compiled, and asking for
// the CUDA augmenter is a CudaError, as asking for the CUDA mel engine is.
#include "augment/augment.h"
#include "melforge/common/errors.h"

namespace melforge::augment {

std::unique_ptr<Augmenter> make_cuda_augmenter(const Bank& /*noise*/, const Bank& /*rir*/, int /*sample_rate*/,
                                               int /*device*/, int64_t /*max_batch_samples*/) {
  throw CudaError("built without CUDA (MELFORGE_CUDA=OFF): the CUDA augmenter is unavailable; use the CPU engine");
}

}  // namespace melforge::augment
