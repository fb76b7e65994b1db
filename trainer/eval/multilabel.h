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

/// Key of a checkpoint's `state` (and of metrics.jsonl's epoch lines, as `val_tuned_threshold`) under which a
/// --task multilabel run stores the global threshold tuned on val for that epoch's weights (best.pt: the one the
/// final evaluation reports as `tuned_threshold`).
inline constexpr const char* kTunedThresholdKey = "tuned_threshold";

/// The val-tuned threshold a checkpoint's `state` stores (kTunedThresholdKey), or -1 when it stores none (a
/// multiclass checkpoint, or one written before the threshold was stored). Throws FormatError naming `what` when
/// the entry is not a number in [0, 1].
double stored_threshold(const nlohmann::json& state, const std::string& what);

/// The --aggregate a run was trained with (its config's eval.aggregate: "mean" or "max"; "mean" when absent).
std::string trained_aggregate(const nlohmann::json& train_config);

/// The test line `melforge-train train` prints at the end of a multilabel run: "mAP 0.8123 (micro 0.8011), ROC-AUC
/// 0.9312; micro-F1 0.7012, macro-F1 0.6900 at the threshold tuned on val (0.412)" (at `m.f1.threshold` when no
/// tuned threshold was applied).
std::string multilabel_summary(const metrics::MultilabelMetrics& m);

}  // namespace melforge::trainer
