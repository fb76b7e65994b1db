#include "eval/verification.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linspace.h>
#include <c10/core/GradMode.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <map>
#include <vector>

#include "data/dataset.h"
#include "eval/batching.h"
#include "eval/metrics.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "models/model.h"
#include "util.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

template <typename T>
void read_verify_field(const nlohmann::json& j, const char* name, T& value) {
  if (!j.contains(name)) return;
  try {
    j.at(name).get_to(value);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("verify options: field '") + name + "': " + e.what());
  }
}

}  // namespace

void VerifyOptions::validate() const {
  if (trial_count < 2 || trial_count % 2 != 0)
    throw InvalidArgument("--trial-count must be even and >= 2, got " + std::to_string(trial_count));
  if (as_norm < 0 || as_norm == 1)
    throw InvalidArgument("--as-norm must be 0 (off) or a top-k of at least 2, got " + std::to_string(as_norm));
  if (cohort_size < 0 || cohort_size == 1)
    throw InvalidArgument("--cohort-size must be 0 (every training file) or >= 2, got " +
                          std::to_string(cohort_size));
  if (cohort_size > 0 && as_norm == 0) throw InvalidArgument("--cohort-size needs --as-norm K");
}

nlohmann::json VerifyOptions::to_json() const {
  return {{"trials", trials.empty() ? std::string() : std::filesystem::absolute(trials).lexically_normal().string()},
          {"trial_count", trial_count},
          {"trial_seed", trial_seed},
          {"as_norm", as_norm},
          {"cohort_size", cohort_size}};
}

VerifyOptions VerifyOptions::from_json(const nlohmann::json& j) {
  VerifyOptions o;
  std::string trials;
  read_verify_field(j, "trials", trials);
  o.trials = trials;
  read_verify_field(j, "trial_count", o.trial_count);
  read_verify_field(j, "trial_seed", o.trial_seed);
  read_verify_field(j, "as_norm", o.as_norm);
  read_verify_field(j, "cohort_size", o.cohort_size);
  return o;
}

void add_options(po::options_description& desc, VerifyOptions& o) {
  desc.add_options()("trials", po::value(&o.trials)->value_name("FILE"),
                     "verification: trial list in VoxCeleb's format (`1 a.wav b.wav`, paths as in the dataset) for "
                     "the evaluated (test) split; default: trials generated from it")(
      "trial-count", po::value(&o.trial_count)->default_value(o.trial_count)->value_name("N"),
      "verification: trials generated per split without --trials (half target, half non-target)")(
      "trial-seed", po::value(&o.trial_seed)->default_value(o.trial_seed)->value_name("N"),
      "verification: seed of the generated trials")(
      "as-norm", po::value(&o.as_norm)->default_value(o.as_norm)->value_name("K"),
      "verification: AS-norm scores with the top K of a cohort of training-file embeddings (0: cosine)")(
      "cohort-size", po::value(&o.cohort_size)->default_value(o.cohort_size)->value_name("N"),
      "verification: at most N training files in the AS-norm cohort (0: all)");
}

at::Tensor embed_split(Classifier& model, const Split& split, int64_t batch_size, at::Device device,
                       at::ScalarType autocast, Coverage* coverage) {
  if (!split.has_frames() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no clips to embed");
  const data::views::ViewOptions trained = resolve_view_options(data::views::ViewOptions{}, split, model.kind());
  const EvalPlan plan = plan_evaluation(split, evaluation_view_options(trained, split, model.kind()), batch_size);
  if (coverage) *coverage = plan.coverage;
  ModeGuard mode(model);
  model.eval();
  c10::NoGradGuard no_grad;
  AutocastGuard autocast_guard(device.type(), autocast);
  std::vector<at::Tensor> embeddings, clips;
  for_each_batch(split, plan, [&](const ExampleBatch& b) {
    const ModelOutput out = forward_batch(model, b, device);
    if (!out.embedding.defined())
      throw InvalidArgument("embed: the model (" + model.kind() + ") gives no speaker embedding");
    embeddings.push_back(out.embedding.to(at::kFloat));
    clips.push_back(b.clip.to(device));
  });
  const at::Tensor clip = at::cat(clips);
  const at::Tensor mean = clip_means(at::cat(embeddings), clip, clip_counts(clip, split.files())).to(at::kFloat);
  return (mean / mean.norm(2, 1, true).clamp_min(1e-12)).to(at::kCPU);
}

std::vector<int32_t> split_labels(const Split& split) {
  const at::Tensor l = split.label.to(at::kCPU, at::kInt).contiguous();
  return {l.data_ptr<int32_t>(), l.data_ptr<int32_t>() + l.numel()};
}

int64_t first_non_finite_row(const at::Tensor& embeddings) {
  const at::Tensor bad = embeddings.isfinite().all(1).logical_not().nonzero();
  return bad.size(0) > 0 ? bad[0][0].item<int64_t>() : -1;
}

std::pair<int64_t, int64_t> trial_pairs(const std::vector<int32_t>& labels) {
  std::map<int32_t, int64_t> per_class;
  for (const int32_t l : labels) ++per_class[l];
  const auto n = static_cast<int64_t>(labels.size());
  int64_t target = 0;
  for (const auto& [label, count] : per_class) target += count * (count - 1) / 2;
  return {target, n * (n - 1) / 2 - target};
}

std::vector<verification::Trial> split_trials(const std::vector<int32_t>& labels,
                                              const std::vector<std::string>& paths, const VerifyOptions& opts,
                                              bool use_list, const std::string& split_name, std::string* log) {
  if (use_list && !opts.trials.empty()) {
    require_regular_file(opts.trials, "trial list");
    return verification::read_trials(opts.trials, paths);
  }
  const auto [target, nontarget] = trial_pairs(labels);
  if (target == 0 || nontarget == 0)
    throw FormatError("split '" + split_name + "' cannot give verification trials: it has " + std::to_string(target) +
                      " target and " + std::to_string(nontarget) + " non-target pairs of files (it needs a class "
                      "with 2 files and 2 classes)");
  const int64_t count = std::min(opts.trial_count, 2 * std::min(target, nontarget));
  if (count < opts.trial_count && log)
    *log = fmt("split '%s' has %lld target and %lld non-target file pairs: %lld trials instead of --trial-count %lld",
               split_name.c_str(), static_cast<long long>(target), static_cast<long long>(nontarget),
               static_cast<long long>(count), static_cast<long long>(opts.trial_count));
  return verification::generate_trials(labels, count, opts.trial_seed);
}

EvalResult score_trials(const at::Tensor& embeddings, const std::vector<verification::Trial>& trials,
                        const VerifyOptions& opts, const at::Tensor& cohort) {
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor e = embeddings.to(at::kCPU, at::kFloat).contiguous();
  std::vector<float> scores;
  if (opts.as_norm > 0) {
    const at::Tensor c = cohort.to(at::kCPU, at::kFloat).contiguous();
    scores = verification::as_norm(e.data_ptr<float>(), e.size(0), e.size(1), trials, c.data_ptr<float>(), c.size(0),
                                   opts.as_norm);
  } else {
    scores = verification::cosine_scores(e.data_ptr<float>(), e.size(0), e.size(1), trials);
  }
  const std::vector<uint8_t> targets = verification::trial_targets(trials);
  EvalResult r;
  r.is_verification = true;
  r.det = verification::det_curve(scores, targets);
  r.verification = verification::error_rates(scores, targets);
  r.file_scores = embeddings;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.files_per_s = r.seconds > 0 ? static_cast<double>(e.size(0)) / r.seconds : 0.0;
  return r;
}

at::Tensor cohort_rows(const at::Tensor& train_embeddings, const VerifyOptions& opts) {
  if (opts.as_norm == 0) return {};
  const int64_t n = train_embeddings.size(0);
  if (opts.cohort_size == 0 || opts.cohort_size >= n) return train_embeddings;
  const at::Tensor idx = at::linspace(0, static_cast<double>(n - 1), opts.cohort_size, at::kDouble).round().to(at::kLong);
  return train_embeddings.index_select(0, idx);
}

nlohmann::json verification_json(const EvalResult& result, const VerifyOptions& opts) {
  nlohmann::json j = result.verification.to_json();
  j["EER"] = 100.0 * result.verification.eer;
  j["minDCF_0.01"] = result.verification.min_dcf_01;
  j["minDCF_0.05"] = result.verification.min_dcf_05;
  j["scoring"] = opts.as_norm > 0 ? "as-norm" : "cosine";
  j["as_norm_top_k"] = opts.as_norm;
  j["trials"] = opts.trials.empty() ? std::string("generated") : opts.trials.string();
  return j;
}

}  // namespace melforge::trainer
