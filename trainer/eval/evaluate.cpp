#include "eval/evaluate.h"

#include <ATen/TensorOperators.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <future>
#include <utility>
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

at::Tensor long_tensor(const std::vector<int64_t>& v) {
  return at::from_blob(const_cast<int64_t*>(v.data()), {static_cast<int64_t>(v.size())}, at::kLong).clone();
}

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
     "short segments per evaluation forward pass (whole files, at least one per pass)")
    ("vote", po::value<std::string>(&opts.vote)->default_value(opts.vote),
     "file-level vote over long segments: mean or majority")
    ("threshold", po::value<double>(&opts.threshold)->default_value(opts.threshold, default_text(opts.threshold)),
     "detection probability at or above which the detection head says positive, in (0, 1); multilabel: class "
     "probability at or above which a file carries the class")
    ("aggregate", po::value<std::string>(&opts.aggregate)->default_value(opts.aggregate),
     "multilabel: file score per class from its segments' probabilities: mean or max");
}

nlohmann::json EvalResult::to_json(const std::vector<std::string>& class_names) const {
  if (is_verification)
    return {{"verification", verification.to_json()}, {"seconds", seconds}, {"files_per_s", files_per_s}};
  if (is_multilabel)
    return {{"multilabel", multilabel.to_json(class_names)}, {"seconds", seconds}, {"files_per_s", files_per_s}};
  return {{"segment", segment.to_json(class_names)},
          {"file", file.to_json(class_names)},
          {"seconds", seconds},
          {"files_per_s", files_per_s}};
}

EvalResult evaluate(Classifier& model, const Split& split, int64_t positive_class, double bce_weight,
                    const EvalOptions& opts, at::Device device, at::ScalarType autocast) {
  opts.validate();
  const Vote vote = parse_vote(opts.vote);
  if (!split.has_mel() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no files to evaluate");
  const auto start = std::chrono::steady_clock::now();
  const int64_t F = split.files(), L = split.info.num_long, S = split.info.num_short, M = split.info.n_mels,
                T = split.info.n_frames;
  const int64_t C = static_cast<int64_t>(split.class_names.size());
  if (positive_class < -1 || positive_class >= C)
    throw InvalidArgument("evaluate: positive class " + std::to_string(positive_class) + " outside [0, " +
                          std::to_string(C) + ")");

  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  AutocastGuard autocast_guard(device.type(), autocast);

  const at::Tensor labels = split.label.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor nvl = split.num_valid_long.to(at::kCPU, at::kLong).contiguous();
  const int64_t* valid = nvl.data_ptr<int64_t>();
  const auto float_opts = at::TensorOptions().dtype(at::kFloat).device(device);

  MetricAccumulator segments(C, positive_class, opts.threshold, device);
  std::vector<at::Tensor> class_probs, predicted, det_score, detected;
  std::vector<int64_t> global, local;
  const std::vector<std::pair<int64_t, int64_t>> ranges = file_ranges(valid, F, S, opts.batch_size);
  const auto read = [&split](std::pair<int64_t, int64_t> r) { return split.read_files(r.first, r.second - r.first); };
  std::future<at::Tensor> ahead;
  if (split.streamed()) ahead = std::async(std::launch::async, read, ranges.front());
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const auto [f0, f1] = ranges[r];
    at::Tensor files;
    if (ahead.valid()) {
      files = ahead.get();
      if (r + 1 < ranges.size()) ahead = std::async(std::launch::async, read, ranges[r + 1]);
    } else {
      files = read(ranges[r]);
    }
    const int64_t nb = f1 - f0;
    global.clear();
    local.clear();
    for (int64_t f = f0; f < f1; ++f) {
      for (int64_t l = 0; l < valid[f]; ++l) {
        global.push_back(f * L + l);
        local.push_back((f - f0) * L + l);
      }
    }
    const int64_t V = static_cast<int64_t>(global.size());
    const at::Tensor gidx = long_tensor(global);
    const at::Tensor lidx_cpu = long_tensor(local);
    const at::Tensor block = files.reshape({nb * L, S, M, T});
    const at::Tensor x = block.index_select(0, lidx_cpu).reshape({V * S, M, T}).to(device);
    const at::Tensor y = labels.index_select(0, gidx.div(L, "floor")).repeat_interleave(S).to(device);
    const ModelOutput out = model.forward(x);
    const at::Tensor loss = combined_loss(out, y, positive_class, bce_weight) * static_cast<double>(V * S);
    segments.add(out.logits, out.detection, y, loss);

    const at::Tensor lidx = lidx_cpu.to(device);
    const at::Tensor probs = at::softmax(out.logits.to(at::kFloat), 1).view({V, S, C});
    const at::Tensor det = at::sigmoid(out.detection.to(at::kFloat)).view({V, S});
    const at::Tensor bp = at::zeros({nb * L, S, C}, float_opts).index_copy_(0, lidx, probs).view({nb, L, S, C});
    const at::Tensor bd = at::zeros({nb * L, S}, float_opts).index_copy_(0, lidx, det).view({nb, L, S});
    FileScores fs = aggregate_files(bp, bd, nvl.slice(0, f0, f1).to(device), vote, opts.threshold);
    class_probs.push_back(fs.class_probs);
    predicted.push_back(fs.predicted);
    det_score.push_back(fs.detection_score);
    detected.push_back(fs.detected);
  }

  EvalResult r;
  r.files.class_probs = at::cat(class_probs).to(at::kCPU);
  r.files.predicted = at::cat(predicted).to(at::kCPU);
  r.files.detection_score = at::cat(det_score).to(at::kCPU);
  r.files.detected = at::cat(detected).to(at::kCPU);
  r.segment = segments.finish();
  r.file = file_metrics(r.files, labels, C, positive_class);
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
