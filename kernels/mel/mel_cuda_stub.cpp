// The CUDA engine's entry points when melforge is built with -DMELFORGE_CUDA=OFF: no device, and a clear error.
#include "mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge::mel {

CudaDeviceQuery query_cuda_devices() { return {}; }

CudaDeviceSupport cuda_device_support(int device) {
  CudaDeviceSupport s;
  s.device = device;
  s.problem = "built without CUDA (MELFORGE_CUDA=OFF)";
  return s;
}

std::string cuda_architectures() { return ""; }

bool cuda_available() { return false; }

int cuda_device_count() { return 0; }

std::unique_ptr<MelEngine> make_cuda_engine(const EngineConfig& /*config*/) {
  throw CudaError("built without CUDA (MELFORGE_CUDA=OFF): the CUDA mel engine is not available");
}

}  // namespace melforge::mel
