#pragma once
/// Multi-label evaluation (`--task multilabel`): sigmoid probabilities of the model's class logits per tile of the
/// evaluation view (every frame of every clip), aggregated per clip (mean or max over its tiles), the BCE loss, and
/// the metrics of kernels/metrics/multilabel.h against the split's target matrix.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/evaluate.h"

namespace melforge::trainer {

class Classifier;
struct ModelOutput;
struct Split;

/// `--task`: multiclass (one class per file, softmax head plus the detection head) or multilabel.
inline constexpr const char* kTaskMulticlass = "multiclass";
inline constexpr const char* kTaskMultilabel = "multilabel";

/// The task a checkpoint's model_config records (`task`; `multiclass` when absent, as in older checkpoints).
std::string model_task(const nlohmann::json& model_config);

/// The multi-label loss averaged over the batch and the classes: binary cross-entropy with logits of `out.logits`
/// [B, C] against `targets` (float 0/1 [B, C]); the detection head is not used. Returns a float scalar tensor.
at::Tensor multilabel_loss(const ModelOutput& out, const at::Tensor& targets);

/// Per-clip class scores from example probabilities `probs` (sigmoid of the logits, [E, C]) and `clip` (int64 [E],
/// each example's clip in [0, clips), same device; every clip has an example): `aggregate` "mean" averages, "max"
/// takes the maximum over each clip's examples. Returns float32 [clips, C]; no host sync.
at::Tensor aggregate_multilabel_clips(const at::Tensor& probs, const at::Tensor& clip, int64_t clips,
                                      const std::string& aggregate);

/// One clip's class scores from the logits of its tiles ([N, C], N >= 1): sigmoid, then mean or max over the N
/// rows. Returns float32 [C]. What predict needs for a multilabel checkpoint.
at::Tensor multilabel_file_scores(const at::Tensor& logits, const std::string& aggregate);

/// Evaluates `model` (eval mode, no autograd; its mode restored) on every clip of `split` (which must have targets)
/// through the evaluation view of opts.view (as evaluate): per-clip scores by opts.aggregate over its tiles, the mean
/// BCE per tile as segment.loss, and the metrics with F1 at opts.threshold and,
/// when `tuned_threshold` >= 0, at it too. Throws FormatError when the split is empty or has no target matrix.
EvalResult evaluate_multilabel(Classifier& model, const Split& split, const EvalOptions& opts, at::Device device,
                               at::ScalarType autocast = at::kFloat, double tuned_threshold = -1);

/// The tuned threshold of a multi-label evaluation (metrics::tune_threshold over its file scores and targets).
double tuned_threshold(const EvalResult& result, const Split& split);

}  // namespace melforge::trainer
