#pragma once
/// The FFT step of the CUDA kernel-body tests (tests/test_mel_cuda_bodies.cpp, tests/test_mel_ragged_bodies.cpp),
/// which chain the bodies on the CPU: a naive double DFT in place of cuFFT. Needs the CUDA include path (float2).
#include <cmath>
#include <cstdint>
#include <vector>

#include <vector_types.h>

namespace melforge::test {

/// Naive double DFT of each [n_fft] row of `frames` into [n_freqs] complex bins, stored as cuFFT's R2C output.
inline void naive_rfft(const std::vector<float>& frames, int n_fft, int64_t rows, std::vector<float2>& spectrum) {
  const int n_freqs = n_fft / 2 + 1;
  const double pi = 3.14159265358979323846;
  std::vector<double> c(static_cast<size_t>(n_fft));
  std::vector<double> s(static_cast<size_t>(n_fft));
  for (int j = 0; j < n_fft; ++j) {
    c[static_cast<size_t>(j)] = std::cos(2.0 * pi * j / n_fft);
    s[static_cast<size_t>(j)] = std::sin(2.0 * pi * j / n_fft);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = frames.data() + r * n_fft;
    for (int k = 0; k < n_freqs; ++k) {
      double re = 0.0;
      double im = 0.0;
      for (int n = 0; n < n_fft; ++n) {
        const auto j = static_cast<size_t>((static_cast<int64_t>(k) * n) % n_fft);
        re += x[n] * c[j];
        im -= x[n] * s[j];
      }
      spectrum[static_cast<size_t>(r * n_freqs + k)] = float2{static_cast<float>(re), static_cast<float>(im)};
    }
  }
}

}  // namespace melforge::test
