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
namespace fs = std::filesystem;

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
  if (embed_crops < 0 || embed_crops > kMaxEmbedCrops)
    throw InvalidArgument("--embed-crops must be 0 (whole utterances) or 1.." + std::to_string(kMaxEmbedCrops) +
                          ", got " + std::to_string(embed_crops));
  if (!trials_root.empty() && trials.empty()) throw InvalidArgument("--trials-root needs --trials FILE");
  for (std::size_t i = 0; i < trials.size(); ++i) {
    if (trials[i].empty()) throw InvalidArgument("--trials: an empty path");
    for (std::size_t j = 0; j < i; ++j)
      if (fs::absolute(trials[i]).lexically_normal() == fs::absolute(trials[j]).lexically_normal())
        throw InvalidArgument("--trials: '" + trials[i].string() + "' is given twice");
  }
}

nlohmann::json VerifyOptions::to_json() const {
  nlohmann::json lists = nlohmann::json::array();
  for (const fs::path& t : trials) lists.push_back(fs::absolute(t).lexically_normal().string());
  return {{"trials", lists},         {"trials_root", trials_root}, {"trial_count", trial_count},
          {"trial_seed", trial_seed}, {"as_norm", as_norm},         {"cohort_size", cohort_size},
          {"embed_crops", embed_crops}};
}

VerifyOptions VerifyOptions::from_json(const nlohmann::json& j) {
  VerifyOptions o;
  if (j.contains("trials") && j["trials"].is_string()) {
    if (const std::string one = j["trials"].get<std::string>(); !one.empty()) o.trials.emplace_back(one);
  } else {
    std::vector<std::string> lists;
    read_verify_field(j, "trials", lists);
    o.trials.assign(lists.begin(), lists.end());
  }
  read_verify_field(j, "trials_root", o.trials_root);
  read_verify_field(j, "trial_count", o.trial_count);
  read_verify_field(j, "trial_seed", o.trial_seed);
  read_verify_field(j, "as_norm", o.as_norm);
  read_verify_field(j, "cohort_size", o.cohort_size);
  read_verify_field(j, "embed_crops", o.embed_crops);
  return o;
}

void add_options(po::options_description& desc, VerifyOptions& o) {
  desc.add_options()("trials", po::value(&o.trials)->composing()->value_name("FILE"),
                     "verification: trial list in VoxCeleb's format (`1 a.wav b.wav`) for the evaluated (test) split; "
                     "repeat for several lists, all scored on one set of embeddings; default: trials generated from "
                     "the split")(
      "trials-root", po::value(&o.trials_root)->value_name("DIR"),
      "verification: the folder the lists' paths are relative to (a relative DIR: relative to the folder the "
      "dataset's paths are relative to, e.g. `wav`)")(
      "trial-count", po::value(&o.trial_count)->default_value(o.trial_count)->value_name("N"),
      "verification: trials generated per split without --trials (half target, half non-target)")(
      "trial-seed", po::value(&o.trial_seed)->default_value(o.trial_seed)->value_name("N"),
      "verification: seed of the generated trials")(
      "as-norm", po::value(&o.as_norm)->default_value(o.as_norm)->value_name("K"),
      "verification: AS-norm scores with the top K of a cohort of training-file embeddings (0: cosine)")(
      "cohort-size", po::value(&o.cohort_size)->default_value(o.cohort_size)->value_name("N"),
      "verification: at most N training files in the AS-norm cohort (0: all)")(
      "embed-crops", po::value(&o.embed_crops)->default_value(o.embed_crops)->value_name("N"),
      "verification: embed each file as the mean of N evenly spaced crops of --crop-seconds (0: the whole "
      "utterance)");
}

namespace {

/// The clip embeddings of `plan`'s examples: each example's embedding, averaged per clip, L2-normalised.
at::Tensor embed_plan(Classifier& model, const Split& split, const EvalPlan& plan, at::Device device,
                      at::ScalarType autocast) {
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

}  // namespace

at::Tensor embed_split(Classifier& model, const Split& split, int64_t batch_size, at::Device device,
                       at::ScalarType autocast, Coverage* coverage, const EmbedCrops& crops) {
  if (!split.has_frames() || split.files() == 0)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + ") has no clips to embed");
  const data::views::ViewOptions trained = resolve_view_options(data::views::ViewOptions{}, split, model.kind());
  if (crops.count > 0 && split.meta.schema_version < 3)
    throw InvalidArgument("--embed-crops needs whole clips: split '" + split.name + "' (" + split.path.string() +
                          ") is schema " + std::to_string(split.meta.schema_version) + " (stored short segments)");
  const EvalPlan plan =
      crops.count > 0
          ? plan_crops(split, frame_rate(split.info).frames(crops.seconds), crops.count, trained.clip_batch_seconds)
          : plan_evaluation(split, evaluation_view_options(trained, split, model.kind()), batch_size);
  if (coverage) *coverage = plan.coverage;
  return embed_plan(model, split, plan, device, autocast);
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

std::vector<SplitTrials> split_trial_sets(const std::vector<int32_t>& labels, const std::vector<std::string>& paths,
                                          const VerifyOptions& opts, bool use_list, const std::string& split_name,
                                          std::string* log) {
  std::vector<SplitTrials> sets;
  if (use_list && !opts.trials.empty()) {
    const verification::TrialPathIndex index(paths);
    const verification::TrialPathRules rules{opts.trials_root};
    for (const fs::path& list : opts.trials) {
      verification::TrialList read = verification::read_trial_list(list, index, rules);
      sets.push_back({list, std::move(read.trials), std::move(read.enroll), std::move(read.test)});
    }
    return sets;
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
  SplitTrials generated;
  generated.trials = verification::generate_trials(labels, count, opts.trial_seed);
  for (const verification::Trial& t : generated.trials) {
    generated.enroll.push_back(paths[static_cast<std::size_t>(t.enroll)]);
    generated.test.push_back(paths[static_cast<std::size_t>(t.test)]);
  }
  sets.push_back(std::move(generated));
  return sets;
}

std::vector<verification::Trial> split_trials(const std::vector<int32_t>& labels,
                                              const std::vector<std::string>& paths, const VerifyOptions& opts,
                                              bool use_list, const std::string& split_name, std::string* log) {
  return std::move(split_trial_sets(labels, paths, opts, use_list, split_name, log).front().trials);
}

EvalResult score_trials(const at::Tensor& embeddings, const std::vector<verification::Trial>& trials,
                        const VerifyOptions& opts, const at::Tensor& cohort, std::vector<float>* scores_out) {
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
  if (scores_out) *scores_out = std::move(scores);
  return r;
}

at::Tensor cohort_rows(const at::Tensor& train_embeddings, const VerifyOptions& opts) {
  if (opts.as_norm == 0) return {};
  const int64_t n = train_embeddings.size(0);
  if (opts.cohort_size == 0 || opts.cohort_size >= n) return train_embeddings;
  const at::Tensor idx = at::linspace(0, static_cast<double>(n - 1), opts.cohort_size, at::kDouble).round().to(at::kLong);
  return train_embeddings.index_select(0, idx);
}

nlohmann::json verification_json(const EvalResult& result, const VerifyOptions& opts, const fs::path& list) {
  nlohmann::json j = result.verification.to_json();
  j["EER"] = 100.0 * result.verification.eer;
  j["minDCF_0.01"] = result.verification.min_dcf_01;
  j["minDCF_0.05"] = result.verification.min_dcf_05;
  j["scoring"] = opts.as_norm > 0 ? "as-norm" : "cosine";
  j["as_norm_top_k"] = opts.as_norm;
  j["embed_crops"] = opts.embed_crops;
  j["trials"] = list.empty() ? std::string("generated") : list.string();
  return j;
}

std::string scores_text(const SplitTrials& set, const std::vector<float>& scores) {
  if (scores.size() != set.trials.size() || set.enroll.size() != set.trials.size() ||
      set.test.size() != set.trials.size())
    throw InvalidArgument("scores_text: " + std::to_string(scores.size()) + " scores for " +
                          std::to_string(set.trials.size()) + " trials");
  std::string out;
  out.reserve(scores.size() * 64);
  for (std::size_t i = 0; i < scores.size(); ++i)
    out += fmt("%.6f %d ", static_cast<double>(scores[i]), set.trials[i].target ? 1 : 0) + set.enroll[i] + ' ' +
           set.test[i] + '\n';
  return out;
}

namespace {

/// `where/<name>.scores` for each list: several lists' scores files in a folder.
std::vector<fs::path> list_scores_paths(const fs::path& where, const std::vector<fs::path>& lists,
                                        const std::string& flag) {
  std::vector<fs::path> out;
  for (std::size_t i = 0; i < lists.size(); ++i) {
    out.push_back(where / (lists[i].filename().string() + ".scores"));
    for (std::size_t j = 0; j < i; ++j)
      if (lists[j].filename() == lists[i].filename())
        throw InvalidArgument(flag + ": the trial lists '" + lists[j].string() + "' and '" + lists[i].string() +
                              "' share the file name whose scores file " + out.back().string() +
                              " would be; copy one under another name");
  }
  return out;
}

}  // namespace

std::vector<fs::path> scores_paths(const fs::path& where, const std::vector<SplitTrials>& sets,
                                   const std::string& flag) {
  if (sets.size() <= 1) return {where};
  std::vector<fs::path> lists;
  for (const SplitTrials& s : sets) lists.push_back(s.list);
  return list_scores_paths(where, lists, flag);
}

void check_scores_path(const fs::path& where, const std::vector<fs::path>& lists, const std::string& flag) {
  std::error_code ec;
  const fs::path parent = fs::absolute(where).parent_path();
  if (lists.size() > 1) {
    list_scores_paths(where, lists, flag);
    if (fs::is_directory(where, ec)) return;
    if (fs::exists(where, ec))
      throw InvalidArgument(flag + " " + where.string() + ": with " + std::to_string(lists.size()) +
                            " trial lists this is a folder (one <list>.scores file per list), and a file is there");
  } else if (fs::is_directory(where, ec)) {
    throw InvalidArgument(flag + " " + where.string() + " is a folder; with one trial list it names the scores file");
  }
  if (!fs::is_directory(parent, ec))
    throw InvalidArgument(flag + " " + where.string() + ": the folder " + parent.string() + " does not exist");
}

}  // namespace melforge::trainer
