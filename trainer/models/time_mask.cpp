#include "models/time_mask.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <limits>
#include <vector>

#include "melforge/common/errors.h"
#include "util.h"

#ifdef MELFORGE_TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace melforge::trainer {

namespace {

/// Whether the current CUDA stream is being captured into a CUDA Graph (never without CUDA).
bool capturing_cuda_graph(const at::Tensor& t) {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  return t.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  (void)t;
  return false;
#endif
}

/// `lengths` [B] viewed as [B, 1, ..., 1] for a tensor of `dim` axes.
at::Tensor per_row(const at::Tensor& lengths, int64_t dim) {
  std::vector<int64_t> shape(static_cast<std::size_t>(dim), 1);
  shape[0] = lengths.size(0);
  return lengths.view(shape);
}

/// time_mask(lengths, T) viewed as [B, 1, ..., 1, T] for `x` [B, ..., T].
at::Tensor mask_like(const at::Tensor& x, const at::Tensor& lengths) {
  std::vector<int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape.front() = x.size(0);
  shape.back() = x.size(-1);
  return time_mask(lengths, x.size(-1)).view(shape);
}

}  // namespace

at::Tensor check_lengths(const at::Tensor& lengths, int64_t batch, int64_t frames, const at::Device& device,
                         const std::string& model) {
  if (!lengths.defined()) return lengths;
  if (lengths.scalar_type() != at::kLong || lengths.dim() != 1 || lengths.size(0) != batch)
    throw InvalidArgument(model + ": lengths must be an int64 tensor of shape [" + std::to_string(batch) +
                          "] (real frames per row), got " + std::string(c10::toString(lengths.scalar_type())) + " " +
                          shape_text(lengths.sizes()));
  if (!capturing_cuda_graph(lengths) && batch > 0) {
    const at::Tensor bad = (lengths < 1).logical_or(lengths > frames);
    if (bad.any().item<bool>()) {
      const int64_t row = bad.to(at::kLong).argmax().item<int64_t>();
      throw InvalidArgument(model + ": lengths[" + std::to_string(row) + "] = " +
                            std::to_string(lengths[row].item<int64_t>()) + " real frames, outside [1, " +
                            std::to_string(frames) + "] (the input's frames)");
    }
  }
  return lengths.device() == device ? lengths : lengths.to(device, /*non_blocking=*/true);
}

at::Tensor downsampled_lengths(const at::Tensor& lengths, int64_t k, int64_t t_out) {
  if (!lengths.defined()) return lengths;
  return (lengths + (k - 1)).div(k, "floor").clamp(1, t_out);
}

at::Tensor time_mask(const at::Tensor& lengths, int64_t frames) {
  return at::arange(frames, lengths.options()).unsqueeze(0) < lengths.unsqueeze(1);
}

at::Tensor mask_time(const at::Tensor& x, const at::Tensor& lengths) {
  if (!lengths.defined()) return x;
  return at::where(mask_like(x, lengths), x, 0);
}

at::Tensor pad_time_to_multiple(const at::Tensor& x, int64_t k) {
  const int64_t t = x.size(-1), extra = (k - t % k) % k;
  if (extra == 0) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = extra;
  return at::cat({x, at::zeros(shape, x.options())}, -1);
}

at::Tensor masked_mean_time(const at::Tensor& x, const at::Tensor& lengths) {
  if (!lengths.defined()) return x.mean(-1);
  return mask_time(x, lengths).sum(-1) / per_row(lengths, x.dim() - 1).to(x.scalar_type());
}

at::Tensor masked_max_time(const at::Tensor& x, const at::Tensor& lengths) {
  if (!lengths.defined()) return x.amax(-1);
  return at::where(mask_like(x, lengths), x, -std::numeric_limits<double>::infinity()).amax(-1);
}

at::Tensor full_lengths(int64_t batch, int64_t frames, const at::Device& device) {
  return at::full({batch}, frames, at::TensorOptions().dtype(at::kLong).device(device));
}

}  // namespace melforge::trainer
