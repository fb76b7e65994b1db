#pragma once
/// The random generators a run saves and restores: the default generator of a device (dropout and SpecAugment draw
/// from it), its state as bytes and as hex text, and the seed of each rank of a data-parallel job.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace melforge::trainer {

/// The default generator of `device`: the CPU's, or the CUDA device's.
at::Generator default_generator(at::Device device);

/// The state of default_generator(device): a uint8 CPU tensor [bytes] (at::Generator::get_state()).
at::Tensor rng_state(at::Device device = at::kCPU);

/// Sets default_generator(device) to a state rng_state() returned.
void set_rng_state(const at::Tensor& state, at::Device device = at::kCPU);

/// A uint8 tensor [n] as 2n lowercase hex digits (a generator state in a checkpoint's JSON).
std::string to_hex(const at::Tensor& bytes);

/// The inverse of to_hex(): a uint8 CPU tensor [s.size() / 2].
at::Tensor from_hex(const std::string& s);

/// The seed of rank `rank`'s generator (dropout, SpecAugment): `seed` mixed with the rank (splitmix64), so that
/// the ranks of a job do not draw the same masks.
uint64_t mix_seed(uint64_t seed, uint64_t rank);

}  // namespace melforge::trainer
