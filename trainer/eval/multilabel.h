#pragma once
/// Multi-label evaluation (`--task multilabel`): sigmoid probabilities of the model's class logits per short
/// segment, aggregated per file (mean or max over every valid short segment), the BCE loss, and the metrics of
/// kernels/metrics/multilabel.h against the split's target matrix.
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

/// Per-file class scores from segment probabilities `probs` (sigmoid of the logits, [F, L, S, C], any value in
/// long segments >= num_valid_long) and `num_valid_long` (int64 [F], same device): `aggregate` "mean" averages,
/// "max" takes the maximum over the valid short segments of each file. Returns float32 [F, C].
at::Tensor aggregate_multilabel(const at::Tensor& probs, const at::Tensor& num_valid_long, const std::string& aggregate);

/// One file's class scores from the logits of its segments ([N, C], N >= 1 valid short segments): sigmoid, then
/// mean or max over the N rows. Returns float32 [C]. What predict needs for a multilabel checkpoint.
at::Tensor multilabel_file_scores(const at::Tensor& logits, const std::string& aggregate);

/// Evaluates `model` (eval mode, no autograd; its mode restored) on `split` (which must have targets): per-file
/// scores by opts.aggregate, the mean BCE per segment as segment.loss, and the metrics with F1 at opts.threshold and,
/// when `tuned_threshold` >= 0, at it too. Throws FormatError when the split is empty or has no target matrix.
EvalResult evaluate_multilabel(Classifier& model, const Split& split, const EvalOptions& opts, at::Device device,
                               at::ScalarType autocast = at::kFloat, double tuned_threshold = -1);

/// The tuned threshold of a multi-label evaluation (metrics::tune_threshold over its file scores and targets).
double tuned_threshold(const EvalResult& result, const Split& split);

}  // namespace melforge::trainer
