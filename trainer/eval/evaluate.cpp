#include "eval/evaluate.h"

#include <ATen/TensorOperators.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <c10/core/GradMode.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <vector>

#include "data/dataset.h"
#include "eval/batching.h"
#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "models/model.h"
#include "util.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// File-level metrics of per-file decisions (CPU tensors) through metrics::file_metrics.
Metrics file_metrics(const FileScores& fs, const at::Tensor& labels, int64_t num_classes, int64_t positive_class) {
  const int64_t F = labels.size(0);
  const int64_t* y = labels.data_ptr<int64_t>();
  const int64_t* p = fs.predicted.data_ptr<int64_t>();
  const bool* d = fs.detected.data_ptr<bool>();
  return metrics::file_metrics(std::vector<int64_t>(y, y + F), std::vector<int64_t>(p, p + F),
                               std::vector<uint8_t>(d, d + F), num_classes, positive_class);
}

}  // namespace

void EvalOptions::validate() const {
  if (split != "train" && split != "val" && split != "test")
    throw InvalidArgument("--split: '" + split + "' is not one of train, val, test");
  if (batch_size < 1) throw InvalidArgument("--eval-batch-size must be >= 1 (got " + std::to_string(batch_size) + ")");
  parse_vote(vote);
  if (aggregate != "mean" && aggregate != "max")
    throw InvalidArgument("--aggregate: '" + aggregate + "' is not one of mean, max");
  if (!(threshold > 0 && threshold < 1))
    throw InvalidArgument("--threshold must be in (0, 1) (got " + std::to_string(threshold) + ")");
}

void add_options(po::options_description& desc, EvalOptions& opts) {
  desc.add_options()
    ("split", po::value<std::string>(&opts.split)->default_value(opts.split), "split to evaluate: train, val or test")
    ("eval-batch-size", po::value<int64_t>(&opts.batch_size)->default_value(opts.batch_size),
     "tiles per evaluation forward pass")
    ("vote", po::value<std::string>(&opts.vote)->default_value(opts.vote),
     "clip-level vote over each clip's tiles: mean or majority")
    ("threshold", po::value<double>(&opts.threshold)->default_value(opts.threshold, default_text(opts.threshold)),
     "detection probability at or above which the detection head says positive, in (0, 1); multilabel: class "
     "probability at or above which a file carries the class")
    ("aggregate", po::value<std::string>(&opts.aggregate)->default_value(opts.aggregate),
     "multilabel: clip score per class from its tiles' probabilities: mean or max");
}

nlohmann::json metrics_json(const metrics::Metrics& m, const std::vector<std::string>& class_names) {
  const auto classes = static_cast<int64_t>(m.confusion.size());
  if (classes <= kMaxFullConfusionClasses) return m.to_json(class_names);
  metrics::Metrics without = m;
  without.confusion.clear();
  nlohmann::json j = without.to_json(class_names);
  j.erase("confusion");
  struct Cell {
    int64_t count, truth, predicted;
  };
  std::vector<Cell> cells;
  for (int64_t t = 0; t < classes; ++t)
    for (int64_t p = 0; p < classes; ++p)
      if (t != p && m.confusion[t][p] > 0) cells.push_back({m.confusion[t][p], t, p});
  const auto keep = std::min<std::size_t>(cells.size(), kTopConfusions);
  std::partial_sort(cells.begin(), cells.begin() + static_cast<std::ptrdiff_t>(keep), cells.end(),
                    [](const Cell& a, const Cell& b) {
                      return a.count != b.count ? a.count > b.count
                                                : std::tie(a.truth, a.predicted) < std::tie(b.truth, b.predicted);
                    });
  nlohmann::json top = nlohmann::json::array();
  const auto name = [&](int64_t i) {
    return i < static_cast<int64_t>(class_names.size()) ? class_names[i] : std::to_string(i);
  };
  for (std::size_t i = 0; i < keep; ++i)
    top.push_back({{"true", name(cells[i].truth)}, {"predicted", name(cells[i].predicted)}, {"count", cells[i].count}});
  j["confusion_top"] = std::move(top);
  j["confusion_note"] = fmt("%lld classes: more than %lld, so the full confusion matrix is not written (nor the "
                            "confusion CSVs); confusion_top lists the %zu largest of its %zu non-zero off-diagonal "
                            "cells",
                            static_cast<long long>(classes), static_cast<long long>(kMaxFullConfusionClasses), keep,
                            cells.size());
  return j;
}

nlohmann::json EvalResult::to_json(const std::vector<std::string>& class_names) const {
  nlohmann::json j = {{"coverage", coverage.to_json()}, {"seconds", seconds}, {"files_per_s", files_per_s}};
  if (is_verification) {
    j["verification"] = verification.to_json();
  } else if (is_multilabel) {
    j["multilabel"] = multilabel.to_json(class_names);
  } else {
    j["tiles"] = metrics_json(segment, class_names);
    j["file"] = metrics_json(file, class_names);
  }
  return j;
}

EvalResult evaluate(Classifier& model, const Split& split, int64_t positive_class, double bce_weight,
                    const EvalOptions& opts, at::Device device, at::ScalarType autocast) {
  opts.validate();
  const Vote vote = parse_vote(opts.vote);
  if (!split.has_frames() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no clips to evaluate");
  const auto start = std::chrono::steady_clock::now();
  const int64_t F = split.files(), C = static_cast<int64_t>(split.class_names.size());
  if (positive_class < -1 || positive_class >= C)
    throw InvalidArgument("evaluate: positive class " + std::to_string(positive_class) + " outside [0, " +
                          std::to_string(C) + ")");
  const EvalPlan plan = plan_evaluation(split, evaluation_view_options(opts.view, split, model.kind()),
                                        opts.batch_size);
  check_model_frames(model, plan);

  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  AutocastGuard autocast_guard(device.type(), autocast);

  const at::Tensor labels = split.label.to(at::kCPU, at::kLong).contiguous();
  MetricAccumulator examples(C, positive_class, opts.threshold, device);
  std::vector<at::Tensor> probs, det, clips;
  for_each_batch(split, plan, [&](const ExampleBatch& b) {
    const at::Tensor y = labels.index_select(0, b.clip).to(device);
    const ModelOutput out = forward_batch(model, b, device);
    const at::Tensor loss = combined_loss(out, y, positive_class, bce_weight) * static_cast<double>(y.size(0));
    examples.add(out.logits, out.detection, y, loss);
    probs.push_back(at::softmax(out.logits.to(at::kFloat), 1));
    det.push_back(at::sigmoid(out.detection.to(at::kFloat)));
    clips.push_back(b.clip.to(device));
  });
  EvalResult r;
  const FileScores fs = vote_clips(at::cat(probs), at::cat(det), at::cat(clips), F, vote, opts.threshold);
  r.files.class_probs = fs.class_probs.to(at::kCPU);
  r.files.predicted = fs.predicted.to(at::kCPU);
  r.files.detection_score = fs.detection_score.to(at::kCPU);
  r.files.detected = fs.detected.to(at::kCPU);
  r.segment = examples.finish();
  r.file = file_metrics(r.files, labels, C, positive_class);
  r.coverage = plan.coverage;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.files_per_s = r.seconds > 0 ? static_cast<double>(F) / r.seconds : 0.0;
  return r;
}

int64_t first_non_finite_file(const EvalResult& result) {
  if (result.is_multilabel || result.is_verification) {
    if (!result.file_scores.defined()) return -1;
    const at::Tensor bad = result.file_scores.isfinite().all(1).logical_not().nonzero();
    return bad.size(0) > 0 ? bad[0][0].item<int64_t>() : -1;
  }
  const at::Tensor probs = result.files.class_probs, score = result.files.detection_score;
  if (!probs.defined() || !score.defined()) return -1;
  const at::Tensor bad = probs.isfinite().all(1).logical_and(score.isfinite()).logical_not().nonzero();
  return bad.size(0) > 0 ? bad[0][0].item<int64_t>() : -1;
}

}  // namespace melforge::trainer
