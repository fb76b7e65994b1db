#include <cmath>

#include "data/dataset.h"
#include "eval/verification.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "train/aam.h"
#include "train/run.h"
#include "util.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

/// Where train writes the test split's trial scores: scores_test.txt for one set, else scores_test/<list>.scores.
std::vector<fs::path> test_scores_paths(const fs::path& run_dir, const std::vector<SplitTrials>& sets) {
  return scores_paths(sets.size() > 1 ? run_dir / "scores_test" : run_dir / "scores_test.txt", sets, "--trials");
}

}  // namespace

void Run::check_verification_splits(const Dataset& meta) const {
  for (const Split* split : {&meta.val, &meta.test}) {
    if (cfg_.verify.embed_crops > 0 && split->meta.schema_version < 3)
      throw InvalidArgument("--embed-crops needs whole clips: split '" + split->name + "' (" + split->path.string() +
                            ") is schema " + std::to_string(split->meta.schema_version) + " (stored short segments)");
    const auto sets = split_trial_sets(split_labels(*split), split->paths, cfg_.verify, split == &meta.test,
                                       split->name);
    if (split == &meta.test) test_scores_paths(run_dir_, sets);
  }
}

double Run::aam_margin() const {
  const auto warmup = static_cast<int64_t>(std::llround(cfg_.train.margin_warmup * static_cast<double>(steps_per_epoch_)));
  return warmup_margin(cfg_.train.margin, step_, warmup);
}

EvalResult Run::evaluate_verification(const Split& split, bool use_list, const at::Tensor& cohort) const {
  Coverage coverage;
  const at::Tensor emb = embed_split(*model_, split, cfg_.eval.batch_size, s_.device, s_.autocast, &coverage,
                                     {cfg_.verify.embed_crops, cfg_.view.crop_seconds});
  if (first_non_finite_row(emb) >= 0) {
    EvalResult r;
    r.coverage = coverage;
    r.is_verification = true;
    r.file_scores = emb;
    r.verification.eer = std::nan("");
    return r;
  }
  const std::string key = split.name + (use_list ? "/list" : "");
  auto it = trials_.find(key);
  if (it == trials_.end()) {
    std::string said;
    it = trials_.emplace(key, split_trials(split_labels(split), split.paths, cfg_.verify, use_list, split.name, &said))
             .first;
    if (!said.empty()) log_.info(said);
  }
  VerifyOptions scoring = cfg_.verify;
  if (!cohort.defined()) scoring.as_norm = 0;
  EvalResult r = score_trials(emb, it->second, scoring, cohort);
  r.coverage = coverage;
  return r;
}

void Run::finish_verification(TrainResult& result) {
  const EmbedCrops crops{cfg_.verify.embed_crops, cfg_.view.crop_seconds};
  at::Tensor cohort;
  if (cfg_.verify.as_norm > 0)
    cohort = cohort_rows(
        embed_split(*model_, data_.train, cfg_.eval.batch_size, s_.device, s_.autocast, nullptr, crops), cfg_.verify);
  EvalResult val = evaluate_verification(data_.val, /*use_list=*/false, cohort);
  if (!std::isfinite(val.verification.eer))
    throw Error("best.pt gives a non-finite embedding for a file of split 'val'");
  Coverage coverage;
  const at::Tensor emb =
      embed_split(*model_, data_.test, cfg_.eval.batch_size, s_.device, s_.autocast, &coverage, crops);
  if (first_non_finite_row(emb) >= 0) throw Error("best.pt gives a non-finite embedding for a file of split 'test'");
  std::string said;
  const std::vector<SplitTrials> sets =
      split_trial_sets(split_labels(data_.test), data_.test.paths, cfg_.verify, /*use_list=*/true, "test", &said);
  if (!said.empty()) log_.info(said);
  const std::vector<fs::path> scores_files = test_scores_paths(run_dir_, sets);
  if (sets.size() > 1) fs::create_directories(run_dir_ / "scores_test");
  std::vector<EvalResult> tests;
  nlohmann::json lists = nlohmann::json::object(), written = nlohmann::json::array();
  for (std::size_t k = 0; k < sets.size(); ++k) {
    std::vector<float> scores;
    tests.push_back(score_trials(emb, sets[k].trials, cfg_.verify, cohort, &scores));
    tests.back().coverage = coverage;
    write_file_atomically(scores_files[k], scores_text(sets[k], scores));
    written.push_back(fs::absolute(scores_files[k]).string());
    if (!sets[k].list.empty()) lists[sets[k].list.string()] = verification_json(tests[k], cfg_.verify, sets[k].list);
  }
  EvalResult& test = tests.front();
  verification::write_det_png(run_dir_ / "det_test.png", test.det, test.verification.eer);
  nlohmann::json report = report_json(val, test);
  VerifyOptions val_scoring = cfg_.verify;
  val_scoring.trials.clear();
  report["val"]["verification"] = verification_json(val, val_scoring, {});
  report["test"]["verification"] = verification_json(test, cfg_.verify, sets.front().list);
  report["test"]["lists"] = lists;
  report["test"]["scores"] = written;
  report.update({{"task", kTaskVerification}, {"det_png", fs::absolute(run_dir_ / "det_test.png").string()}});
  write_json_atomically(run_dir_ / "report.json", report);
  for (std::size_t k = 0; k < sets.size(); ++k) {
    const auto& t = tests[k].verification;
    log_.info(fmt("best epoch %lld (%s %.4f): test EER %.3f %% (%lld target, %lld non-target trials, %s, %s), minDCF "
                  "0.01 %.4f, 0.05 %.4f; scores %s",
                  static_cast<long long>(best_epoch_), cfg_.train.best_metric.c_str(), best_value_, 100.0 * t.eer,
                  static_cast<long long>(t.targets), static_cast<long long>(t.nontargets),
                  sets[k].list.empty() ? "generated" : sets[k].list.string().c_str(),
                  cfg_.verify.as_norm > 0 ? "AS-norm" : "cosine", t.min_dcf_01, t.min_dcf_05,
                  scores_files[k].string().c_str()));
  }
  log_.info("DET curve " + (run_dir_ / "det_test.png").string());
  result.val = std::move(val);
  result.test = std::move(test);
}

}  // namespace melforge::trainer
