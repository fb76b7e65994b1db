#pragma once
/// Real frames and padding along the time axis (the last axis) of a model's activations. A batch row is its real
/// frames first, then padding (/work/plan contract "Masks are lengths"): `lengths` (int64 [B], real frames per row)
/// says where each row's padding begins. An undefined `lengths` means every frame is real, and every function here
/// then does what the unmasked operation does.
///
/// What makes a padded row give the output of the same row alone (the models' property tests): every operation that
/// mixes time steps (a convolution wider than 1 in time, a pooling, a mean, a softmax, a recurrence run backwards)
/// reads the padding as zeros (mask_time before it) or not at all (the masked reductions); after a time downsampling
/// by k the real steps are downsampled_lengths(lengths, k, t_out).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace melforge::trainer {

/// Checks `lengths` against a batch of `batch` rows of `frames` time steps and returns it as int64 on `device`
/// (undefined stays undefined). It must be an int64 tensor of shape [batch] with 1 <= lengths[b] <= frames. The
/// values are checked on the CPU before the copy to `device`; lengths already on a CUDA device are checked there
/// (one synchronisation), except inside a CUDA Graph capture, where a synchronisation is not allowed (the captured
/// step's static lengths buffer is then the caller's to fill correctly). Throws InvalidArgument naming `model`.
at::Tensor check_lengths(const at::Tensor& lengths, int64_t batch, int64_t frames, const at::Device& device,
                         const std::string& model);

/// Real steps after a time downsampling by `k` to `t_out` steps: max(1, min(ceil(lengths / k), t_out)). Undefined
/// stays undefined.
at::Tensor downsampled_lengths(const at::Tensor& lengths, int64_t k, int64_t t_out);

/// A bool mask [B, frames], true at the real steps (t < lengths[b]). `lengths` must be defined.
at::Tensor time_mask(const at::Tensor& lengths, int64_t frames);

/// `x` [B, ..., T] with every step t >= lengths[b] set to 0 (whatever it held, NaN and infinities included); `x`
/// itself when `lengths` is undefined.
at::Tensor mask_time(const at::Tensor& x, const at::Tensor& lengths);

/// `x` [B, ..., T] padded with zeros at the end of the time axis to a multiple of `k` steps; `x` itself when T is a
/// multiple already.
at::Tensor pad_time_to_multiple(const at::Tensor& x, int64_t k);

/// The mean of `x` [B, ..., T] over its real steps: [B, ...]. x.mean(-1) when `lengths` is undefined.
at::Tensor masked_mean_time(const at::Tensor& x, const at::Tensor& lengths);

/// The maximum of `x` [B, ..., T] over its real steps: [B, ...]. x.amax(-1) when `lengths` is undefined.
at::Tensor masked_max_time(const at::Tensor& x, const at::Tensor& lengths);

/// Lengths [B] of `batch` rows all `frames` long (int64 on `device`): what a model uses where an input needs masking
/// although the caller gave no lengths (its time axis padded inside the model).
at::Tensor full_lengths(int64_t batch, int64_t frames, const at::Device& device);

}  // namespace melforge::trainer
