#include <ATen/ops/arange.h>

#include <cmath>
#include <sstream>

#include "data/loader.h"
#include "eval/multilabel.h"
#include "melforge/common/csv.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "train/aam.h"
#include "train/mixup.h"
#include "train/run.h"
#include "util.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

/// `scores` (float32 CPU [F, C]) as CSV: a header "path,<class names>" and one row per file of `split`.
std::string scores_csv(const Split& split, const at::Tensor& scores) {
  std::ostringstream out;
  out.precision(9);
  out << "path";
  for (const auto& c : split.class_names) out << ',' << csv_field(c);
  out << '\n';
  const at::Tensor s = scores.to(at::kFloat).contiguous();
  const float* p = s.data_ptr<float>();
  for (int64_t f = 0; f < split.files(); ++f) {
    out << csv_field(split.paths[static_cast<std::size_t>(f)]);
    for (int64_t c = 0; c < s.size(1); ++c) out << ',' << p[f * s.size(1) + c];
    out << '\n';
  }
  return out.str();
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

void Run::check_task(const Dataset& meta) const {
  if (multilabel_ && !meta.multilabel())
    throw FormatError("--task multilabel: the dataset " + cfg_.data.data.string() + " has no multi-label targets "
                      "matrix (build it from a manifest whose label field names several labels, e.g. "
                      "clip.wav,dog;bark); use --task multiclass for a single-label dataset");
  if (multilabel_ && cfg_.train.cuda_graph)
    throw InvalidArgument("--cuda-graph is not supported with --task multilabel");
  if (!multilabel_ && meta.multilabel())
    log_.warn("the dataset " + cfg_.data.data.string() + " is multi-label; --task " + cfg_.train.task + " trains on "
              "each file's first label only (use --task multilabel for all of them)");
  if (verification_) check_verification_splits(meta);
}

const Split& Run::loader_split() {
  if (!multilabel_) return data_.train;
  rows_split_ = data_.train;
  rows_split_.label = at::arange(data_.train.files(), at::kLong);
  return rows_split_;
}

at::Tensor Run::training_loss(const ModelOutput& out, const Batch& batch, const MixupDraw* mix) const {
  const at::Device device = out.logits.device();
  if (multilabel_) {
    const at::Tensor targets = train_targets_.index_select(0, batch.y.to(s_.device)).to(device);
    return multilabel_loss(out, mix ? mix_targets(targets, *mix) : targets);
  }
  const auto loss = [&](const at::Tensor& y) { return labels_loss(out, y); };
  if (!mix) return loss(batch.y.to(device));
  return mix_losses(loss(batch.y), loss(batch.y.index_select(0, mix->perm.to(batch.y.device()))), *mix);
}

at::Tensor Run::labels_loss(const ModelOutput& out, const at::Tensor& labels) const {
  if (verification_) return aam_softmax_loss(out.logits, labels, aam_margin(), cfg_.train.scale);
  return combined_loss(out, labels, s_.positive_index, cfg_.train.bce_weight,
                       s_.pos_weight_tensor.to(out.logits.device()));
}

EvalResult Run::evaluate_split(const Split& split, double tuned) const {
  if (verification_) return evaluate_verification(split, /*use_list=*/false);
  if (multilabel_) return evaluate_multilabel(*model_, split, cfg_.eval, s_.device, s_.autocast, tuned);
  return evaluate(*model_, split, s_.positive_index, cfg_.train.bce_weight, cfg_.eval, s_.device, s_.autocast);
}

nlohmann::json Run::model_config() const {
  nlohmann::json j = model_->config_json();
  if (multilabel_) j["task"] = kTaskMultilabel;
  if (verification_) j["task"] = kTaskVerification;
  return j;
}

void Run::task_fields(nlohmann::json& line, const EvalResult& val) const {
  if (multilabel_ || s_.positive_index < 0)
    for (const char* key : {"val_det_f1", "val_file_det_f1"}) line.erase(key);
  if (verification_) {
    for (const char* key : {"val_loss", "val_accuracy", "val_macro_f1", "val_file_accuracy", "val_file_macro_f1"})
      line.erase(key);
    line.update({{"val_eer", num(100.0 * val.verification.eer)},
                 {"val_min_dcf_0.01", num(val.verification.min_dcf_01)},
                 {"val_min_dcf_0.05", num(val.verification.min_dcf_05)},
                 {"margin", aam_margin()}});
    return;
  }
  if (!multilabel_) return;
  for (const char* key : {"train_accuracy", "val_accuracy", "val_macro_f1", "val_file_accuracy", "val_file_macro_f1"})
    line.erase(key);
  const auto& m = val.multilabel;
  line.update({{"val_map", num(m.map_macro)},
               {"val_map_micro", num(m.map_micro)},
               {"val_auc", num(m.auc_macro)},
               {"val_f1_micro", m.f1.micro},
               {"val_f1_macro", m.f1.macro},
               {std::string("val_") + kTunedThresholdKey, tuned_threshold(val, data_.val)}});
}

nlohmann::json Run::report_json(const EvalResult& val, const EvalResult& test) const {
  nlohmann::json j = {{"run_dir", fs::absolute(run_dir_).string()},
          {"checkpoint", fs::absolute(run_dir_ / "checkpoints" / "best.pt").string()},
          {"classes", data_.class_names},
          {"epochs_done", epoch_},
          {"best_epoch", best_epoch_},
          {"best_metric", cfg_.train.best_metric},
          {"best_value", best_value_},
          {"early_stopped", early_stopped_},
          {"val", val.to_json(data_.class_names)},
          {"test", test.to_json(data_.class_names)}};
  if (!dataset_changes_.empty()) j["dataset_changes"] = dataset_changes_;
  return j;
}

void Run::finish_multilabel(TrainResult& result) {
  EvalResult val = evaluate_split(data_.val);
  const double tuned = tuned_threshold(val, data_.val);
  val = evaluate_split(data_.val, tuned);
  EvalResult test = evaluate_split(data_.test, tuned);
  write_file_atomically(run_dir_ / "scores_val.csv", scores_csv(data_.val, val.file_scores));
  write_file_atomically(run_dir_ / "scores_test.csv", scores_csv(data_.test, test.file_scores));
  nlohmann::json report = report_json(val, test);
  report.update({{"task", kTaskMultilabel},
                 {"aggregate", cfg_.eval.aggregate},
                 {"threshold", cfg_.eval.threshold},
                 {"tuned_threshold", tuned}});
  write_json_atomically(run_dir_ / "report.json", report);
  const auto& t = test.multilabel;
  log_.info(fmt("best epoch %lld (%s %.4f): test mAP %.4f (micro %.4f), ROC-AUC %.4f; F1 micro %.4f macro %.4f at "
                "%.3g, micro %.4f macro %.4f at the threshold tuned on val (%.4g)",
                static_cast<long long>(best_epoch_), cfg_.train.best_metric.c_str(), best_value_, t.map_macro,
                t.map_micro, t.auc_macro, t.f1.micro, t.f1.macro, cfg_.eval.threshold, t.f1_tuned.micro,
                t.f1_tuned.macro, tuned));
  result.val = std::move(val);
  result.test = std::move(test);
}

}  // namespace melforge::trainer
