#include "train/graph_step.h"

#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>

#include "data/loader.h"
#include "melforge/common/errors.h"
#include "options.h"
#include "train/optim.h"
#include "train/setup.h"
#include "util.h"

#ifdef MELFORGE_TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace melforge::trainer {

/// The CUDA Graph, once captured (empty in a build without CUDA, where it is never made).
struct GraphStep::Captured {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  at::cuda::CUDAGraph graph;
#endif
};

GraphStep::GraphStep(Classifier& model, AdamW& opt, const std::vector<at::Tensor>& params, BatchLoader& loader,
                     const StepSetup& setup, StepLoss loss, double clip_norm, const Logger& log)
    : model_(model),
      opt_(opt),
      params_(params),
      loader_(loader),
      setup_(setup),
      loss_fn_(std::move(loss)),
      clip_norm_(clip_norm),
      log_(log) {}

GraphStep::~GraphStep() = default;

/// Forward, backward and optimizer step on the static buffers (lr as a device tensor).
void GraphStep::body() {
  {
    AutocastGuard autocast(setup_.device.type(), setup_.autocast);
    out_ = model_.forward(x_, lengths_);
    loss_ = loss_fn_(out_, y_);
  }
  loss_.backward();
  if (clip_norm_ > 0) clip_grad_norm(params_, clip_norm_);
  opt_.step(lr_);
}

/// Captures body() once. The loader's prefetch thread is paused for the capture and the capture is thread-local
/// (cudaStreamCaptureModeThreadLocal); why both: trainer/README.md, "CUDA Graph capture and the prefetch thread".
void GraphStep::capture() {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  const LoaderPause quiet(loader_);
  sync_device(setup_.device);
  opt_.zero_grad();
  captured_ = std::make_unique<Captured>();
  {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    captured_->graph.capture_begin(c10::MempoolId_t{0, 0}, cudaStreamCaptureModeThreadLocal);
    body();
    captured_->graph.capture_end();
    at::autocast::set_autocast_cache_enabled(cache);
  }
  sync_device(setup_.device);
  log_.info("captured the training step in a CUDA Graph (thread-local capture, loader prefetch paused)");
#endif
}

ModelOutput GraphStep::step(const at::Tensor& x, const at::Tensor& lengths, const at::Tensor& y, double lr,
                             at::Tensor& loss) {
#ifdef MELFORGE_TRAINER_HAVE_CUDA
  constexpr int64_t kWarmupSteps = 3;
  if (!x_.defined()) {
    x_ = at::empty_like(x);
    lengths_ = at::empty_like(lengths);
    y_ = at::empty_like(y);
    lr_ = at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(setup_.device));
  }
  x_.copy_(x, /*non_blocking=*/true);
  lengths_.copy_(lengths, /*non_blocking=*/true);
  y_.copy_(y, /*non_blocking=*/true);
  lr_.fill_(lr);
  if (!captured_ && warmup_done_ < kWarmupSteps) {
    sync_device(setup_.device);
    {
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      opt_.zero_grad();
      body();
    }
    sync_device(setup_.device);
    ++warmup_done_;
  } else {
    if (!captured_) capture();
    captured_->graph.replay();
  }
  loss = loss_;
  return out_;
#else
  (void)x;
  (void)lengths;
  (void)y;
  (void)lr;
  (void)loss;
  throw Error("--cuda-graph: this melforge-train was built without CUDA");
#endif
}

}  // namespace melforge::trainer
