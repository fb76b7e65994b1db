#pragma once
/// --cuda-graph: the training step (forward, loss, backward, clipping, AdamW step) captured once in a CUDA Graph and
/// replayed on static buffers, so that a step costs one graph launch instead of hundreds of kernel launches.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/model.h"

namespace melforge::trainer {

class AdamW;
class BatchLoader;
class Logger;
struct StepSetup;

/// The training loss of a batch from the model's output and the labels [B] (captured: it must queue device work
/// only, with constants fixed at capture).
using StepLoss = std::function<at::Tensor(const ModelOutput& out, const at::Tensor& labels)>;

/// The captured training step of one run. Everything passed to the constructor must outlive it.
class GraphStep {
 public:
  /// `params`: the model's parameters (clipped to `clip_norm` when > 0, then stepped by `opt`); `loader`: paused
  /// while the step is captured; `setup`: device and autocast of the forward; `loss`: the training loss.
  GraphStep(Classifier& model, AdamW& opt, const std::vector<at::Tensor>& params, BatchLoader& loader,
            const StepSetup& setup, StepLoss loss, double clip_norm, const Logger& log);
  ~GraphStep();
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  /// One training step on the batch `x` [B, n_mels, T] (or channels-last [B, 1, n_mels, T]) of real frames
  /// `lengths` (int64 [B]) with labels `y` [B] at learning rate `lr`: the first steps run eagerly on a side stream
  /// (warmup), the next one is captured, the rest replay the capture. The batch is copied into the static input
  /// buffers (every batch must have the first one's shape); gradients stay allocated between replays. Returns the model's output and sets
  /// `loss` (a scalar): the static output buffers, overwritten by the next step. Throws Error when this build has
  /// no CUDA.
  ModelOutput step(const at::Tensor& x, const at::Tensor& lengths, const at::Tensor& y, double lr, at::Tensor& loss);

 private:
  struct Captured;

  void body();
  void capture();

  Classifier& model_;
  AdamW& opt_;
  const std::vector<at::Tensor>& params_;
  BatchLoader& loader_;
  const StepSetup& setup_;
  StepLoss loss_fn_;
  double clip_norm_;
  const Logger& log_;
  at::Tensor x_, lengths_, y_, lr_, loss_;
  ModelOutput out_;
  int64_t warmup_done_ = 0;
  std::unique_ptr<Captured> captured_;
};

}  // namespace melforge::trainer
