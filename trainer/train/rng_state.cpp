#include "train/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <mutex>

#include "melforge/common/splitmix.h"

namespace melforge::trainer {

at::Generator default_generator(at::Device device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device) : at::detail::getDefaultCPUGenerator();
}

at::Tensor rng_state(at::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Tensor& state, at::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::string to_hex(const at::Tensor& bytes) {
  static const char digits[] = "0123456789abcdef";
  const at::Tensor b = bytes.to(at::kCPU).contiguous();
  const auto* p = b.data_ptr<uint8_t>();
  std::string s;
  for (int64_t i = 0; i < b.numel(); ++i) s += {digits[p[i] >> 4], digits[p[i] & 15]};
  return s;
}

at::Tensor from_hex(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  for (std::size_t i = 0; i + 1 < s.size(); i += 2)
    p[i / 2] = static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16));
  return t;
}

uint64_t mix_seed(uint64_t seed, uint64_t rank) { return splitmix64_mix(seed ^ (rank * kSplitMixGamma)); }

}  // namespace melforge::trainer
