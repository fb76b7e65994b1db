#include "eval/multilabel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/index_reduce.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <vector>

#include "data/dataset.h"
#include "eval/batching.h"
#include "eval/metrics.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "models/model.h"
#include "util.h"

namespace melforge::trainer {

namespace {

std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

std::vector<uint8_t> to_bytes(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kByte).contiguous();
  return {c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel()};
}

}  // namespace

std::string model_task(const nlohmann::json& model_config) {
  if (model_config.contains("task") && model_config["task"].is_string()) return model_config["task"].get<std::string>();
  return kTaskMulticlass;
}

at::Tensor multilabel_loss(const ModelOutput& out, const at::Tensor& targets) {
  return at::binary_cross_entropy_with_logits(out.logits.to(at::kFloat), targets.to(at::kFloat));
}

at::Tensor aggregate_multilabel_clips(const at::Tensor& probs, const at::Tensor& clip, int64_t clips,
                                      const std::string& aggregate) {
  if (probs.dim() != 2 || clip.dim() != 1 || clip.size(0) != probs.size(0))
    throw InvalidArgument("aggregate_multilabel_clips: expected probs [E, C] and clip [E]");
  const at::Tensor c = clip.to(probs.device(), at::kLong);
  if (aggregate == "max")
    return at::zeros({clips, probs.size(1)}, probs.options().dtype(at::kFloat))
        .index_reduce_(0, c, probs.to(at::kFloat), "amax", /*include_self=*/false);
  return clip_means(probs, c, clip_counts(c, clips)).to(at::kFloat);
}

at::Tensor multilabel_file_scores(const at::Tensor& logits, const std::string& aggregate) {
  const at::Tensor p = at::sigmoid(logits.to(at::kFloat));
  return aggregate == "max" ? at::amax(p, {0}) : p.mean(0);
}

EvalResult evaluate_multilabel(Classifier& model, const Split& split, const EvalOptions& opts, at::Device device,
                               at::ScalarType autocast, double tuned) {
  opts.validate();
  if (!split.has_frames() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no clips to evaluate");
  if (!split.multilabel())
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no multi-label targets matrix");
  const auto start = std::chrono::steady_clock::now();
  const int64_t F = split.files(), C = static_cast<int64_t>(split.class_names.size());
  const EvalPlan plan = plan_evaluation(split, evaluation_view_options(opts.view, split, model.kind()),
                                        opts.batch_size);
  check_model_frames(model, plan);
  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  AutocastGuard autocast_guard(device.type(), autocast);
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> probs, clips;
  for_each_batch(split, plan, [&](const ExampleBatch& b) {
    const at::Tensor y = split.targets.index_select(0, b.clip).to(device);
    const ModelOutput out = forward_batch(model, b, device);
    loss_sum += multilabel_loss(out, y).to(at::kDouble) * static_cast<double>(y.size(0));
    probs.push_back(at::sigmoid(out.logits.to(at::kFloat)));
    clips.push_back(b.clip.to(device));
  });
  EvalResult r;
  r.is_multilabel = true;
  r.file_scores = aggregate_multilabel_clips(at::cat(probs), at::cat(clips), F, opts.aggregate).to(at::kCPU);
  r.segment.count = plan.coverage.examples;
  r.segment.loss = loss_sum.item<double>() / static_cast<double>(plan.coverage.examples);
  r.coverage = plan.coverage;
  r.multilabel = metrics::multilabel_metrics(to_doubles(r.file_scores), to_bytes(split.targets), F, C, opts.threshold,
                                             tuned, r.segment.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.files_per_s = r.seconds > 0 ? static_cast<double>(F) / r.seconds : 0.0;
  return r;
}

double tuned_threshold(const EvalResult& result, const Split& split) {
  return metrics::tune_threshold(to_doubles(result.file_scores), to_bytes(split.targets));
}

double stored_threshold(const nlohmann::json& state, const std::string& what) {
  if (!state.is_object() || !state.contains(kTunedThresholdKey)) return -1;
  const nlohmann::json& t = state[kTunedThresholdKey];
  if (!t.is_number() || !(t.get<double>() >= 0.0 && t.get<double>() <= 1.0))
    throw FormatError(what + ": entry 'state': '" + std::string(kTunedThresholdKey) + "' is " +
                      utf8::for_terminal(t.dump(), 40) + ", not a threshold in [0, 1]");
  return t.get<double>();
}

std::string trained_aggregate(const nlohmann::json& train_config) {
  if (train_config.is_object() && train_config.contains("eval") && train_config["eval"].is_object()) {
    const nlohmann::json& e = train_config["eval"];
    if (e.contains("aggregate") && e["aggregate"].is_string()) return e["aggregate"].get<std::string>();
  }
  return "mean";
}

std::string multilabel_summary(const metrics::MultilabelMetrics& m) {
  const metrics::F1Scores& f1 = m.has_tuned ? m.f1_tuned : m.f1;
  return fmt("mAP %.4f (micro %.4f), ROC-AUC %.4f; micro-F1 %.4f, macro-F1 %.4f at %s (%.4g)", m.map_macro,
             m.map_micro, m.auc_macro, f1.micro, f1.macro,
             m.has_tuned ? "the threshold tuned on val" : "the threshold", f1.threshold);
}

}  // namespace melforge::trainer
