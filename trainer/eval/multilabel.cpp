#include "eval/multilabel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "eval/batching.h"
#include "melforge/common/errors.h"
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

at::Tensor aggregate_multilabel(const at::Tensor& probs, const at::Tensor& num_valid_long, const std::string& aggregate) {
  const int64_t L = probs.size(1), S = probs.size(2);
  const at::Tensor valid = at::arange(L, num_valid_long.options()).unsqueeze(0).lt(num_valid_long.unsqueeze(1));
  const at::Tensor mask = valid.to(at::kFloat).view({-1, L, 1, 1});
  const at::Tensor masked = probs.to(at::kFloat) * mask;
  if (aggregate == "max") return at::amax(masked, {1, 2});
  return masked.sum({1, 2}) / (num_valid_long.to(at::kFloat) * static_cast<double>(S)).unsqueeze(1);
}

at::Tensor multilabel_file_scores(const at::Tensor& logits, const std::string& aggregate) {
  const at::Tensor p = at::sigmoid(logits.to(at::kFloat));
  return aggregate == "max" ? at::amax(p, {0}) : p.mean(0);
}

EvalResult evaluate_multilabel(Classifier& model, const Split& split, const EvalOptions& opts, at::Device device,
                               at::ScalarType autocast, double tuned) {
  opts.validate();
  if (!split.has_mel() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no files to evaluate");
  if (!split.multilabel())
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no multi-label targets matrix");
  const auto start = std::chrono::steady_clock::now();
  const int64_t F = split.files(), L = split.info.num_long, S = split.info.num_short, M = split.info.n_mels,
                T = split.info.n_frames, C = static_cast<int64_t>(split.class_names.size());
  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  AutocastGuard autocast_guard(device.type(), autocast);
  const at::Tensor nvl = split.num_valid_long.to(at::kCPU, at::kLong).contiguous();
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> scores;
  int64_t segments = 0;
  for (const auto& [f0, f1] : file_ranges(nvl.data_ptr<int64_t>(), F, S, opts.batch_size)) {
    const int64_t nb = f1 - f0;
    std::vector<int64_t> local;
    for (int64_t f = f0; f < f1; ++f)
      for (int64_t l = 0; l < nvl.data_ptr<int64_t>()[f]; ++l) local.push_back((f - f0) * L + l);
    const auto V = static_cast<int64_t>(local.size());
    const at::Tensor lidx = at::from_blob(local.data(), {V}, at::kLong).clone();
    const at::Tensor x = split.read_files(f0, nb).reshape({nb * L, S, M, T}).index_select(0, lidx).reshape({V * S, M, T});
    const at::Tensor rows = lidx.div(L, "floor").add(f0).repeat_interleave(S);
    const at::Tensor y = split.targets.index_select(0, rows).to(device);
    const ModelOutput out = model.forward(x.to(device));
    loss_sum += multilabel_loss(out, y).to(at::kDouble) * static_cast<double>(V * S);
    segments += V * S;
    const at::Tensor probs = at::sigmoid(out.logits.to(at::kFloat)).view({V, S, C});
    const at::Tensor padded =
        at::zeros({nb * L, S, C}, probs.options()).index_copy_(0, lidx.to(device), probs).view({nb, L, S, C});
    scores.push_back(aggregate_multilabel(padded, nvl.slice(0, f0, f1).to(device), opts.aggregate));
  }
  EvalResult r;
  r.is_multilabel = true;
  r.file_scores = at::cat(scores).to(at::kCPU);
  r.segment.count = segments;
  r.segment.loss = loss_sum.item<double>() / static_cast<double>(segments);
  r.multilabel = metrics::multilabel_metrics(to_doubles(r.file_scores), to_bytes(split.targets), F, C, opts.threshold,
                                             tuned, r.segment.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.files_per_s = r.seconds > 0 ? static_cast<double>(F) / r.seconds : 0.0;
  return r;
}

double tuned_threshold(const EvalResult& result, const Split& split) {
  return metrics::tune_threshold(to_doubles(result.file_scores), to_bytes(split.targets));
}

}  // namespace melforge::trainer
