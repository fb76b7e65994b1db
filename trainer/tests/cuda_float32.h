#pragma once
/// CUDA's float32 math settings for the trainer's [cuda] tests that compare CUDA with the CPU. TF32 (a 10-bit mantissa
/// for the operands of cuBLAS matmuls and cuDNN convolutions and RNNs) is cuDNN's default, and trainer::configure_cuda
/// turns it on for matmuls too, process-wide: any test of the one test_trainer process that trains on CUDA leaves it
/// on. A test that compares at float32 tolerances sets the mode it needs with ScopedTf32, which puts back what it
/// found.
#include <ATen/Context.h>

#include <string>

#include "train/setup.h"

namespace melforge::test {

/// For its lifetime, CUDA's float32 math as `tf32` says. false: no TF32 (float32 matmul precision "highest", TF32
/// off in cuDNN's convolutions and RNNs). true: melforge-train's own CUDA settings (trainer::configure_cuda: matmul
/// precision "high", TF32 in cuDNN, cuDNN benchmark mode). When it ends it restores the three settings it found. Uses
/// the same (legacy) setters as configure_cuda, which keep ATen's two records of the TF32 state in agreement.
class ScopedTf32 {
 public:
  explicit ScopedTf32(bool tf32)
      : matmul_(at::globalContext().float32MatmulPrecision()),
        cudnn_tf32_(at::globalContext().allowTF32CuDNN()),
        cudnn_benchmark_(at::globalContext().benchmarkCuDNN()) {
    if (tf32) {
      trainer::configure_cuda(true);
    } else {
      at::globalContext().setFloat32MatmulPrecision("highest");
      at::globalContext().setAllowTF32CuDNN(false);
    }
  }
  ~ScopedTf32() {
    at::globalContext().setFloat32MatmulPrecision(precision_name(matmul_));
    at::globalContext().setAllowTF32CuDNN(cudnn_tf32_);
    at::globalContext().setBenchmarkCuDNN(cudnn_benchmark_);
  }
  ScopedTf32(const ScopedTf32&) = delete;
  ScopedTf32& operator=(const ScopedTf32&) = delete;

  /// The name setFloat32MatmulPrecision takes for `p`.
  static std::string precision_name(at::Float32MatmulPrecision p) {
    switch (p) {
      case at::Float32MatmulPrecision::HIGHEST:
        return "highest";
      case at::Float32MatmulPrecision::HIGH:
        return "high";
      case at::Float32MatmulPrecision::MEDIUM:
        return "medium";
    }
    return "highest";
  }

 private:
  at::Float32MatmulPrecision matmul_;
  bool cudnn_tf32_;
  bool cudnn_benchmark_;
};

}  // namespace melforge::test
