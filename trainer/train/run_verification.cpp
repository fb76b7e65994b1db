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

void Run::check_verification_splits(const Dataset& meta) const {
  for (const Split* split : {&meta.val, &meta.test})
    split_trials(split_labels(*split), split->paths, cfg_.verify, split == &meta.test, split->name);
}

double Run::aam_margin() const {
  const auto warmup = static_cast<int64_t>(std::llround(cfg_.train.margin_warmup * static_cast<double>(steps_per_epoch_)));
  return warmup_margin(cfg_.train.margin, step_, warmup);
}

EvalResult Run::evaluate_verification(const Split& split, bool use_list, const at::Tensor& cohort) const {
  Coverage coverage;
  const at::Tensor emb = embed_split(*model_, split, cfg_.eval.batch_size, s_.device, s_.autocast, &coverage);
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
  at::Tensor cohort;
  if (cfg_.verify.as_norm > 0)
    cohort = cohort_rows(embed_split(*model_, data_.train, cfg_.eval.batch_size, s_.device, s_.autocast), cfg_.verify);
  EvalResult val = evaluate_verification(data_.val, /*use_list=*/false, cohort);
  EvalResult test = evaluate_verification(data_.test, /*use_list=*/true, cohort);
  for (const EvalResult* r : {&val, &test})
    if (!std::isfinite(r->verification.eer))
      throw Error("best.pt gives a non-finite embedding for a file of split '" +
                  std::string(r == &val ? "val" : "test") + "'");
  verification::write_det_png(run_dir_ / "det_test.png", test.det, test.verification.eer);
  nlohmann::json report = report_json(val, test);
  VerifyOptions val_scoring = cfg_.verify;
  val_scoring.trials.clear();
  report["val"]["verification"] = verification_json(val, val_scoring);
  report["test"]["verification"] = verification_json(test, cfg_.verify);
  report.update({{"task", kTaskVerification}, {"det_png", fs::absolute(run_dir_ / "det_test.png").string()}});
  write_json_atomically(run_dir_ / "report.json", report);
  const auto& t = test.verification;
  log_.info(fmt("best epoch %lld (%s %.4f): test EER %.3f %% (%lld target, %lld non-target trials, %s), minDCF "
                "0.01 %.4f, 0.05 %.4f; DET curve %s",
                static_cast<long long>(best_epoch_), cfg_.train.best_metric.c_str(), best_value_, 100.0 * t.eer,
                static_cast<long long>(t.targets), static_cast<long long>(t.nontargets),
                cfg_.verify.as_norm > 0 ? "AS-norm" : "cosine", t.min_dcf_01, t.min_dcf_05,
                (run_dir_ / "det_test.png").string().c_str()));
  result.val = std::move(val);
  result.test = std::move(test);
}

}  // namespace melforge::trainer
